"""modkit models as an lm-evaluation-harness model type, ``modkit`` (needs ``pip install 'modkit-lm[eval]'``).

Any modkit model runs lm-eval tasks this way, including models with third-party components that transformers
cannot load::

    import lm_eval
    import modkit.evaluation.harness  # registers the model type "modkit" in lm-eval's registry

    results = lm_eval.simple_evaluate(model="modkit", model_args="pretrained=runs/x/best,batch_size=8", tasks=["hellaswag"])
    # or: lm_eval.simple_evaluate(model=ModkitLM("runs/x/best"), tasks=[...]);  or: modkit eval runs/x/best --tasks hellaswag

lm-eval 0.4 finds model types in its registry (``lm_eval.api.registry``; it reads no entry-point group for them),
so importing this module registers ``modkit`` there, and :func:`register` does the same lazily (without importing
this module) for ``modkit eval``.

The three request types follow lm-eval's ``hf`` model type (``lm_eval/models/huggingface.py``) so that a model
exported with :func:`modkit.to_hf` gets the same scores through both:

* ``loglikelihood``: lm-eval's :class:`~lm_eval.api.model.TemplateLM` splits context and continuation (trailing
  spaces move to the continuation; an empty context becomes the prefix token: begin-of-text, else end-of-text);
  the input is the last ``max_length + 1`` tokens of both, minus the last; the score is the sum of the
  continuation's log-probabilities (float32 log-softmax), with whether each of its tokens is the greedy one.
* ``loglikelihood_rolling``: the whole text in disjoint windows of ``max_length`` tokens, each conditioned on the
  end of the previous one (lm-eval's ``get_rolling_token_windows``), summed.
* ``generate_until``: greedy (or sampled, as the task asks) continuation of the context (left-truncated to
  ``max_length - max_gen_toks``) with modkit's KV cache (:func:`modkit.inference.generate.generate`), batched with left
  padding; stops at the end-of-text token or any ``until`` string, and the text is cut before the first of them.

Requests are scored in batches of ``batch_size``, longest first (padding on the right for scoring: causal, so it
changes nothing before it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from tqdm import tqdm

__all__ = ["MODEL_TYPE", "ModkitLM", "register"]

#: The lm-eval model type name.
MODEL_TYPE = "modkit"


def register() -> None:
    """Register :class:`ModkitLM` in lm-eval's model registry as ``modkit`` (lazily: the class loads on first use).

    Idempotent; a registration already there (this module's own, or a plugin's) is kept. lm-eval's own model types
    are registered first (its registry fills itself only while it is empty).
    """
    import lm_eval.models  # noqa: F401,F811 - also imported at the end of this module, after ModkitLM is defined

    if MODEL_TYPE not in model_registry:
        model_registry.register(MODEL_TYPE, target="modkit.evaluation.harness:ModkitLM")


class ModkitLM(TemplateLM):
    """A modkit model for lm-evaluation-harness.

    Args:
        pretrained: a modkit checkpoint folder (``runs/x/best``; its ``tokenizer.json`` is used unless ``tokenizer``
            is given), or a built :class:`~modkit.nn.model.Model` (then ``tokenizer`` is needed).
        tokenizer: a :class:`modkit.data.Tokenizer`, or the path of a ``tokenizer.json`` / folder holding one.
        batch_size: requests per forward (lm-eval passes it as a string; ``"auto"`` means 8).
        device: ``cpu``, ``cuda``, ... (default: cuda when available).
        dtype: the weights' dtype when loading (``float32``, ``bfloat16``, ...); default as saved.
        max_length: the longest input in tokens; default the model's ``max_seq_len``.
        max_gen_toks: default most new tokens of ``generate_until`` (a task's ``max_gen_toks`` wins).

    Raises:
        ValueError: no tokenizer, or one without an end-of-text token (lm-eval needs it as prefix and stop token).
    """

    def __init__(
        self,
        pretrained: Union[str, Path, torch.nn.Module] = None,
        tokenizer: Any = None,
        batch_size: Union[int, str] = 1,
        device: Optional[str] = None,
        dtype: Optional[str] = None,
        max_length: Optional[int] = None,
        max_gen_toks: int = 256,
        **kwargs: Any,
    ):
        super().__init__()
        from modkit.io.checkpoint import load
        from ..data.tokenizer import Tokenizer, load_tokenizer

        kwargs.pop("max_batch_size", None)  # lm-eval's simple_evaluate passes these to every model type
        if kwargs:
            raise ValueError(
                f"modkit model type: unknown arguments {', '.join(sorted(kwargs))}; it takes pretrained, "
                "tokenizer, batch_size, device, dtype, max_length, max_gen_toks"
            )
        self._device = torch.device(device if device else ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(pretrained, torch.nn.Module):
            self.model = pretrained.to(self._device)
        elif pretrained is not None:
            self.model = load(pretrained, device=str(self._device), **({"dtype": dtype} if dtype else {}))
        else:
            raise ValueError(
                "modkit model type: give pretrained=CHECKPOINT_FOLDER (model_args 'pretrained=runs/x/best')"
            )
        self.model.eval()
        if tokenizer is None and not isinstance(pretrained, torch.nn.Module):
            tokenizer = Path(pretrained)
        if tokenizer is None:
            raise ValueError("modkit model type: a Model was given without a tokenizer; pass tokenizer=")
        self.tok: Tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
        if self.tok.eot_id is None:
            raise ValueError(
                f"modkit model type: tokenizer {self.tok.spec!r} has no end-of-text token, which lm-eval "
                "uses as prefix and stop token; name it in the folder's tokenizer_config.json (eos_token)"
            )
        self.batch_size_per_gpu = 8 if str(batch_size).startswith("auto") else int(batch_size)
        self._max_length = int(max_length) if max_length else int(self.model.spec.max_seq_len)
        self._max_gen_toks = int(max_gen_toks)

    # ------------------------------------------------------------------ what lm-eval asks of a model type
    @property
    def eot_token_id(self) -> int:
        """The end-of-text id (lm-eval's stop token and, without a begin-of-text token, the prefix)."""
        return int(self.tok.eot_id)

    @property
    def prefix_token_id(self) -> int:
        """What an empty context becomes: the begin-of-text id, else the end-of-text id (as ``hf``)."""
        return int(self.tok.bos_id) if self.tok.bos_id is not None else int(self.tok.eot_id)

    @property
    def max_length(self) -> int:
        """The longest input, in tokens."""
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        """Default most new tokens of ``generate_until``."""
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        """Requests per forward."""
        return self.batch_size_per_gpu

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self._device

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``: special tokens in the text are recognised, and the tokenizer's post-processor
        (a begin-of-text token, if it adds one) applies unless ``add_special_tokens`` is False or the text already
        starts with the prefix token's text: ``hf``'s rule."""
        add = add_special_tokens is not False
        if add_special_tokens is None and string.startswith(
            self.tok.backend.decode([self.prefix_token_id], skip_special_tokens=False)
        ):
            add = False
        return self.tok.backend.encode(string, add_special_tokens=add).ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``tokens`` (special tokens left out by default, as ``hf``)."""
        return self.tok.backend.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests, disable_tqdm: bool = False, override_bs: Optional[int] = None
    ) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation), every continuation token greedy)`` of ``(key, context_enc, cont_enc)``."""
        bs = override_bs or self.batch_size
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1] + requests[i][2]))
        out: list[Optional[tuple[float, bool]]] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="modkit loglikelihood")
        for lo in range(0, len(order), bs):
            chunk = order[lo : lo + bs]
            inputs, conts = [], []
            for i in chunk:
                _, context_enc, cont_enc = requests[i]
                whole = (list(context_enc) + list(cont_enc))[-(self.max_length + 1) :]
                inputs.append(whole[:-1])
                conts.append(list(cont_enc))
            width = max(len(x) for x in inputs)
            batch = torch.zeros(len(inputs), width, dtype=torch.long)
            for r, x in enumerate(inputs):
                batch[r, : len(x)] = torch.tensor(x, dtype=torch.long)
            logprobs = F.log_softmax(self.model(batch.to(self.device)).logits.float(), dim=-1)
            for r, i in enumerate(chunk):
                n, m = len(inputs[r]), len(conts[r])
                lp = logprobs[r, n - m : n]  # positions whose next token is a continuation token
                target = torch.tensor(conts[r], dtype=torch.long, device=lp.device)
                greedy = bool((lp.argmax(-1) == target).all())
                answer = (float(lp.gather(-1, target[:, None]).sum()), greedy)
                out[i] = answer
                key = requests[i][0]
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
            bar.update(len(chunk))
        bar.close()
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text, in disjoint ``max_length`` windows (lm-eval's rolling windows)."""
        from lm_eval import utils

        spans, counts = [], []
        for (string,) in (req.args for req in requests):
            windows = list(
                map(
                    utils.make_disjoint_window,
                    utils.get_rolling_token_windows(
                        token_list=self.tok_encode(string),
                        prefix_token=self.prefix_token_id,
                        max_seq_len=self.max_length,
                        context_len=1,
                    ),
                )
            )
            spans += [(None, ctx, cont) for ctx, cont in windows]
            counts.append(len(windows))
        scores = self._loglikelihood_tokens(spans, disable_tqdm=disable_tqdm)
        out, at = [], 0
        for req, n in zip(requests, counts):
            total = sum(s for s, _ in scores[at : at + n])
            at += n
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuations of each context, cut before the first ``until`` string (or the end-of-text token)."""
        from modkit.inference.generate import generate

        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        out: list[Optional[str]] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="modkit generate_until")
        for members in groups.values():
            kwargs = dict(requests[members[0]].args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            if eos not in until:
                until.append(eos)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 0.0)) if sample else 0.0
            top_p = kwargs.pop("top_p", None) if sample else None
            seed = kwargs.pop("seed", 0)
            limit = self.max_length - max_new
            if limit < 1:
                raise ValueError(
                    f"max_gen_toks = {max_new} leaves no room for a context in max_length = {self.max_length}"
                )
            encoded = {i: self.tok_encode(requests[i].args[0])[-limit:] for i in members}
            members = sorted(members, key=lambda i: -len(encoded[i]))
            for lo in range(0, len(members), self.batch_size):
                chunk = members[lo : lo + self.batch_size]
                width = max(len(encoded[i]) for i in chunk)
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                mask = torch.zeros(len(chunk), width, dtype=torch.long)
                for r, i in enumerate(chunk):  # left padding
                    ids[r, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                    mask[r, width - len(encoded[i]) :] = 1
                stops = [s for s in until if s != eos]
                tokens = generate(
                    self.model,
                    ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    max_new_tokens=max_new,
                    temperature=temperature,
                    top_p=top_p,
                    seed=seed,
                    eos_token_id=self.eot_token_id,
                    **({"stop_strings": stops, "decode": self.tok_decode} if stops else {}),
                )
                for r, i in enumerate(chunk):
                    new = tokens[r, width:].tolist()
                    if self.eot_token_id in new:
                        new = new[: new.index(self.eot_token_id)]
                    text = self.tok_decode(new)
                    for stop in until:
                        if stop and stop in text:
                            text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return out  # type: ignore[return-value]


import lm_eval.models  # noqa: E402,F401 - lm-eval's own model types first (its registry fills itself only when empty)

register()
model_registry.register(MODEL_TYPE, target=ModkitLM)  # the lazy entry becomes the class itself
