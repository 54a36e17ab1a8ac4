"""The tables of docs/experiments/where-parameters-and-flops-go.md, from ``modkit cost SPEC --context N --json``.

    .venv/bin/python docs/experiments/scripts/cost_tables.py            # writes docs/experiments/results/where-parameters-and-flops-go/

For every spec below and every context in ``CONTEXTS`` it runs the command a user runs, ``modkit cost SPEC
--context N --json`` (a subprocess; the ``modkit`` next to this Python, else the one on ``PATH``), keeps the JSON
objects as they are printed (``cost.json``: spec -> context -> object) and writes the markdown tables of the page
(``tables.md``). Every number in the tables is read from those objects; the only arithmetic here is shares,
ratios and the sums that check that a breakdown adds up. Nothing is allocated: ``modkit cost`` works on ``meta``.
About 8-12 s per call on one core, 2 calls per spec, 3 for the KV-cache comparison's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "docs/experiments/results/where-parameters-and-flops-go"

#: (label, spec path relative to the repository root)
SPECS = [
    ("GPT-1", "specs/gpt-1.json"),
    ("GPT-2 (124M)", "specs/gpt2.json"),
    ("GPT-3 175B", "specs/gpt-3-175b.json"),
    ("Llama 2 7B", "docs/experiments/specs/llama-2-7b.json"),
    ("Llama 3.1 8B", "specs/llama-3.1-8b.json"),
    ("Llama 3.2 1B", "specs/llama-3.2-1b.json"),
    ("Llama 3 70B", "specs/llama-3-70b.json"),
    ("Llama 3.1 405B", "specs/llama-3.1-405b.json"),
    ("Mistral 7B v0.1", "specs/mistral-7b-v0.1.json"),
    ("Mixtral 8x7B", "specs/mixtral-8x7b-v0.1.json"),
    ("Qwen2.5 0.5B", "specs/qwen2.5-0.5b.json"),
    ("Qwen3 0.6B", "specs/qwen3-0.6b.json"),
    ("Gemma 3 1B", "specs/gemma-3-1b.json"),
    ("OLMo 2 1B", "specs/olmo-2-1b.json"),
]
#: The KV-cache comparison: Llama 3 70B as published (GQA, 8 KV heads) and two what-if variants.
VARIANTS = [
    ("Llama 3 70B, MHA (64 KV heads)", "docs/experiments/specs/llama-3-70b-mha.json"),
    ("Llama 3 70B, GQA (8 KV heads, as published)", "specs/llama-3-70b.json"),
    ("Llama 3 70B, MQA (1 KV head)", "docs/experiments/specs/llama-3-70b-mqa.json"),
]
#: The two models of the "why is Llama 3 8B and not 7B" comparison.
OLD_8B, NEW_8B = "docs/experiments/specs/llama-2-7b.json", "specs/llama-3.1-8b.json"
#: The published attention, against which the variants' KV cache is compared.
BASELINE = "specs/llama-3-70b.json"
SHORT, MID, LONG = 1024, 8192, 131072
#: Contexts asked of every spec; the KV-cache comparison's specs are asked at MID too.
CONTEXTS = (SHORT, LONG)
VARIANT_CONTEXTS = (SHORT, MID, LONG)


def modkit_command() -> list[str]:
    """The ``modkit`` executable a user of this environment runs."""
    here = Path(sys.executable).with_name("modkit")
    if here.is_file():
        return [str(here)]
    found = shutil.which("modkit")
    if found is None:
        raise SystemExit("no modkit command found: pip install -e . first")
    return [found]


def cost(spec: str, context: int) -> dict:
    """``modkit cost SPEC --context N --json``, parsed."""
    cmd = [*modkit_command(), "cost", spec, "--context", str(context), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


# ------------------------------------------------------------------------------------------------ formatting


def count(n: float) -> str:
    """1234567 -> '1,234,567'."""
    return f"{int(n):,}"


def human(n: float, unit: str = "") -> str:
    """3.2e9 -> '3.20 G' (decimal prefixes)."""
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f} {p}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def gib(n: float) -> str:
    """Bytes in binary units."""
    for div, p in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return f"{n / div:.2f} {p}"
    return f"{int(n)} B"


def pct(x: float) -> str:
    """0.1234 -> '12.3 %'."""
    return f"{100 * x:.1f} %"


def ctx(n: int | None, max_seq_len: int) -> str:
    """A crossover context, flagged when the model cannot reach it."""
    if n is None:
        return "never"
    return f"{n:,}" + (" †" if n > max_seq_len else "")


def table(head: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    """A markdown table; columns from ``right_from`` on are right-aligned."""
    out = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i < right_from else "---:" for i in range(len(head))) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


# ------------------------------------------------------------------------------------------------ parts


def part_of(key: str) -> str:
    """A FLOPs key -> 'attn_proj' | 'attn_ctx' | 'ffn' | 'head'."""
    if key in ("attention.scores", "attention.weighted_sum"):
        return "attn_ctx"
    if key.startswith("attention."):
        return "attn_proj"
    if key.startswith(("ffn.", "router.")):
        return "ffn"
    if key.startswith("head."):
        return "head"
    raise SystemExit(f"unexpected FLOPs part {key!r}: extend part_of()")


def grouped(per: dict[str, float]) -> dict[str, float]:
    """FLOPs per token summed into the four parts of the page."""
    out = {"attn_proj": 0.0, "attn_ctx": 0.0, "ffn": 0.0, "head": 0.0}
    for k, v in per.items():
        out[part_of(k)] += v
    return out


def spec_json(path: str) -> dict:
    """The spec file itself (for d_model, heads and max_seq_len)."""
    return json.loads((ROOT / path).read_text())


def kv_shape(spec: dict) -> str:
    """'8 x 128' (KV heads x head_dim) of the block's attention, with the window when there is one."""
    att = spec["block"]["attention"]
    heads = att.get("n_heads")
    kv = 1 if att["type"] == "mqa" else att.get("n_kv_heads", heads)
    hd = att.get("head_dim", spec["d_model"] // heads)
    text = f"{kv} x {hd}"
    window = att.get("sliding_window")
    if window:
        unwindowed = [
            o for o in spec.get("overrides", []) if "attention" in o and not o["attention"].get("sliding_window")
        ]
        text += f", window {window:,}" + (" (some layers global)" if unwindowed else "")
    return text


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    """Run every ``modkit cost`` call, write ``cost.json`` and ``tables.md``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("-o", "--out", type=Path, default=OUT)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data: dict[str, dict[str, dict]] = {}
    paths = [path for _, path in SPECS]
    for path in paths + [path for _, path in VARIANTS if path not in paths]:
        data[path] = {}
        for c in VARIANT_CONTEXTS if path in dict(VARIANTS).values() else CONTEXTS:
            t = time.perf_counter()
            data[path][str(c)] = cost(path, c)
            print(f"modkit cost {path} --context {c} --json  ({time.perf_counter() - t:.1f} s)", flush=True)
    (args.out / "cost.json").write_text(json.dumps(data, indent=1) + "\n")

    md: list[str] = [
        "<!-- generated by .venv/bin/python docs/experiments/scripts/cost_tables.py from `modkit cost SPEC --context N --json`; do not edit -->",
        "",
    ]

    # 1. parameters
    md += ["### Parameters by part", ""]
    rows = []
    for label, path in SPECS:
        d = data[path][str(SHORT)]
        pr = d["params"]
        parts = ("embedding", "position", "attention", "ffn", "norm", "lm_head")
        total = pr["total"]
        adds = sum(pr[k] for k in parts) == total
        emb = pr["embedding"] + pr["position"]
        tied = spec_json(path).get("tie_embeddings", False)
        head = "tied" if tied else pct(pr["lm_head"] / total)
        active = d["active_params_per_token"]
        rows.append(
            [
                label,
                count(total) + ("" if active == total else f" ({human(active)} active)"),
                pct(emb / total),
                pct(pr["attention"] / total),
                pct(pr["ffn"] / total),
                f"{100 * pr['norm'] / total:.3f} %",
                head,
                "yes" if adds else "**no**",
            ]
        )
    md += table(
        [
            "model",
            "parameters",
            "embedding (+ positions)",
            "attention",
            "FFN (+ router)",
            "norms",
            "LM head",
            "parts add up",
        ],
        rows,
    )

    # 2. FLOPs per token by part
    md += ["### FLOPs per token by part (prefill: one forward over the context, per token)", ""]
    rows = []
    for label, path in SPECS:
        for c in (SHORT, LONG):
            d = data[path][str(c)]
            per = d["flops_per_token"]["prefill"]
            g = grouped(per)
            tot = sum(g.values())
            n = d["active_params_per_token"]
            mx = spec_json(path)["max_seq_len"]
            rows.append(
                [
                    label if c == SHORT else "",
                    f"{c:,}" + (" †" if c > mx else ""),
                    human(tot, "FLOP"),
                    pct(g["attn_proj"] / tot),
                    pct(g["attn_ctx"] / tot),
                    pct(g["ffn"] / tot),
                    pct(g["head"] / tot),
                    f"{tot / (2 * n):.2f}",
                ]
            )
    md += table(
        [
            "model",
            "context",
            "prefill FLOPs / token",
            "attention projections",
            "attention scores + weighted sum",
            "FFN (+ router)",
            "LM head",
            "÷ 2N (N = active parameters)",
        ],
        rows,
    )

    # 3. crossover
    md += ["### Where attention overtakes the FFN (FLOPs per token)", ""]
    rows = []
    for label, path in SPECS:
        d = data[path][str(SHORT)]
        s = spec_json(path)
        cr = d["attention_overtakes_ffn"]
        mx = s["max_seq_len"]
        rows.append(
            [
                label,
                f"{4 * s['d_model']:,}",
                ctx(cr["decode"]["scores"], mx),
                ctx(cr["prefill"]["scores"], mx),
                ctx(cr["decode"]["with_projections"], mx),
                ctx(cr["prefill"]["with_projections"], mx),
                f"{mx:,}",
            ]
        )
    md += table(
        [
            "model",
            "4 x d_model",
            "decode: scores + weighted sum",
            "prefill: scores + weighted sum",
            "decode: all of attention",
            "prefill: all of attention",
            "max_seq_len",
        ],
        rows,
    )

    # 4. KV cache
    md += ["### KV cache (bfloat16, batch 1)", ""]
    rows = []
    for label, path in SPECS:
        s = spec_json(path)
        short, long_ = data[path][str(SHORT)], data[path][str(LONG)]
        w = long_["weight_bytes"]["bfloat16"]
        mx = s["max_seq_len"]
        rows.append(
            [
                label,
                kv_shape(s),
                f"{s['n_layers']}",
                count(short["kv_cache_bytes"] // SHORT),
                count(long_["kv_cache_bytes"] // LONG),
                gib(short["kv_cache_bytes"]) + (" †" if SHORT > mx else ""),
                gib(long_["kv_cache_bytes"]) + (" †" if LONG > mx else ""),
                gib(w),
                f"{long_['kv_cache_bytes'] / w:.2f}",
            ]
        )
    md += table(
        [
            "model",
            "KV heads x head_dim",
            "layers",
            "bytes / token, mean at 1,024",
            "mean at 131,072",
            "KV at 1,024 tokens",
            "KV at 131,072 tokens",
            "weights (bf16)",
            "KV at 131,072 ÷ weights",
        ],
        rows,
        right_from=2,
    )

    # 4b. Llama 2 7B -> Llama 3.1 8B, part by part
    md += ["### Llama 2 7B to Llama 3.1 8B, part by part", ""]
    old, new = data[OLD_8B][str(SHORT)]["params"], data[NEW_8B][str(SHORT)]["params"]
    rows = [
        [k.replace("_", " "), count(old[k]), count(new[k]), f"{new[k] - old[k]:+,}"]
        for k in ("embedding", "attention", "ffn", "norm", "lm_head", "total")
    ]
    md += table(["part", "Llama 2 7B", "Llama 3.1 8B", "difference"], rows)

    # 5. MHA / GQA / MQA
    md += ["### Llama 3 70B: MHA, GQA and MQA", ""]
    rows = []
    gqa = data[BASELINE]
    for label, path in VARIANTS:
        mid, long_ = data[path][str(MID)], data[path][str(LONG)]
        per_token = mid["kv_cache_bytes"] // MID
        rows.append(
            [
                label,
                count(mid["params"]["total"]),
                count(per_token),
                gib(mid["kv_cache_bytes"]),
                gib(long_["kv_cache_bytes"]),
                f"{mid['kv_cache_bytes'] / gqa[str(MID)]['kv_cache_bytes']:.3g}x",
                f"{1e3 * mid['decode_roofline']['seconds']:.2f}",
                f"{1e3 * long_['decode_roofline']['seconds']:.2f}",
            ]
        )
    md += table(
        [
            "attention",
            "parameters",
            "KV bytes / token",
            "KV at 8,192",
            "KV at 131,072",
            "÷ GQA",
            "roofline ms / token at 8,192",
            "at 131,072",
        ],
        rows,
    )
    md += [
        "† beyond the model's max_seq_len: arithmetic only.",
        "",
        f"Generated in {time.perf_counter() - start:.0f} s by {sum(len(v) for v in data.values())} calls of `modkit cost`.",
        "",
    ]
    (args.out / "tables.md").write_text("\n".join(md))
    print(f"wrote {args.out / 'cost.json'} and {args.out / 'tables.md'} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
