"""The arguments of :func:`modkit.data.prepare.prepare` checked, and the tokenizer they name made ready.

* ``val_fraction`` and the ``eot`` / ``bos`` policies, each wrong value with its fix;
* the *recipe* (tokenizer, split, text field, inputs, separators) compared with the one a folder already holds, so
  a dataset is replaced only by the same preparation again (or with ``overwrite``);
* the separator tokens a policy names: reserved by a tokenizer to train, or the given tokenizer's own.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional, Sequence, Union

from modkit.core.errors import DataError
from modkit.core.jsonio import read_json_file
from .prepare_format import AUTO, META_FILE, NONE
from .sources import DataNote, Source
from .tokenizer import BOS_TOKEN, EOT_TOKEN, Tokenizer, parse_spec, train_tokenizer


def _check_fraction(val_fraction) -> float:
    try:
        value = float(val_fraction)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise DataError(
            f"val_fraction = {val_fraction!r} must be a number in (0, 1), e.g. 0.1 (the last 10% of the tokens)"
        )
    return value


def _check_policy(name: str, value: Union[str, bool, None]) -> str:
    """``eot`` / ``bos`` as stored: ``"auto"``, ``"none"`` or a token (``bos``: True = auto, False / None = none)."""
    if value is True:
        return AUTO
    if value is False or value is None:
        return NONE
    if isinstance(value, str) and value.strip():
        return value.strip() if value.strip().lower() not in (AUTO, NONE) else value.strip().lower()
    raise DataError(
        f"{name} = {value!r}: give 'auto' (the tokenizer's own token), 'none' (insert nothing) or a token of the "
        "vocabulary"
    )


def _check_workers(workers) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DataError(f"workers = {workers!r} must be a positive integer (encoding processes)")


def _recipe(
    tokenizer: str,
    val_fraction: float,
    text_field: str,
    sources: Sequence[str],
    val_sources: Sequence[str],
    eot: str,
    bos: str,
) -> dict:
    return {
        "tokenizer": tokenizer,
        "val_fraction": val_fraction,
        "text_field": text_field,
        "sources": list(sources),
        "val_sources": list(val_sources),
        "eot": eot,
        "bos": bos,
    }


def _old_recipe(old: dict) -> dict:
    """The recipe of an existing ``meta.json`` (one written before documents were separated inserted nothing)."""
    docs = old.get("documents") or {}
    return _recipe(
        old["tokenizer"],
        old["val_fraction"],
        old["text_field"],
        [s.get("label", s["path"]) for s in old["sources"]],
        [s.get("label", s["path"]) for s in old.get("val_sources", [])],
        docs.get("eot_policy", NONE),
        docs.get("bos_policy", NONE),
    )


def _check_out_dir(out: Path, recipe: dict, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder; choose another output folder (-o)")
    meta_path = out / META_FILE
    if overwrite or not meta_path.is_file():
        return
    try:
        old_recipe = _old_recipe(read_json_file(meta_path))
    except (ValueError, KeyError, TypeError, AttributeError):  # JSONInputError is a ValueError
        raise DataError(
            f"{out} holds a {META_FILE} that is not a modkit dataset's; choose another output folder (-o) or delete it"
        ) from None
    if old_recipe != recipe:
        diffs = [
            f"{k} {old_recipe[k]!r} there, {recipe[k]!r} now"
            for k in recipe
            if k not in ("sources", "val_sources") and old_recipe[k] != recipe[k]
        ]
        for k in ("sources", "val_sources"):
            if old_recipe[k] != recipe[k]:
                diffs.append(f"{k} {_short(old_recipe[k])} there, {_short(recipe[k])} now")
        raise DataError(
            f"{out} already holds a different dataset ({'; '.join(diffs)}); choose another output folder (-o) or "
            f"delete {out} first"
        )


def _short(paths: Sequence[str]) -> str:
    names = [Path(p).name for p in paths[:3]]
    return "[" + ", ".join(names) + (f", ... {len(paths)} files" if len(paths) > 3 else "") + "]"


def _no_text(srcs: Sequence[Source]) -> DataError:
    what = ", ".join(f"{s.label} ({s.size:,} bytes)" for s in srcs[:3]) + (
        f" and {len(srcs) - 3} more" if len(srcs) > 3 else ""
    )
    return DataError(
        f"the inputs hold no text: {what}; give files with text in them (for .jsonl, non-empty text fields)"
    )


# ------------------------------------------------------------------------------------------------ tokenizer


def _special(kind: str, policy: str, tok: Optional[Tokenizer], reserved: str) -> Optional[str]:
    """The token a policy names: for a tokenizer to train (``tok`` None), the one to reserve; for a given one, its
    own."""
    if policy == NONE:
        return None
    if tok is None:
        return reserved if policy == AUTO else policy
    if policy == AUTO:
        own = tok.eot if kind == "eot" else tok.bos
        if own is None:
            what = "end-of-text" if kind == "eot" else "begin-of-text"
            specials = ", ".join(repr(t) for t in tok.special_tokens()[:8]) or "none"
            raise DataError(
                f"tokenizer {tok.spec!r} has no {what} token its files name (special tokens: {specials}); name one "
                f"with --{kind} TOKEN ({kind}=...), or --{kind} none to insert nothing"
            )
        return own
    return policy


def _tokenizer(spec_text: str, eot: str, bos: str, texts) -> Tokenizer:
    kind, size = parse_spec(spec_text)
    spec = {"char": "char", "bpe": f"bpe:{size}"}[kind]
    eot_token, bos_token = _special("eot", eot, None, EOT_TOKEN), _special("bos", bos, None, BOS_TOKEN)
    reserved = [t for t in (eot_token, bos_token) if t is not None]
    tok = train_tokenizer(spec, texts, special_tokens=reserved)
    tok.set_special(eot=eot_token, bos=bos_token)
    for name, policy, token_id in (("eot", eot, tok.eot_id), ("bos", bos, tok.bos_id)):
        if policy not in (AUTO, NONE):  # a string of the user's own: added to the new vocabulary, not split
            where = "after" if name == "eot" else "before"
            warnings.warn(
                f"--{name} {policy!r}: added to the trained {spec} tokenizer as a new special token with id "
                f"{token_id}, written {where} every document; give --{name} auto for modkit's own token",
                DataNote,
                stacklevel=2,
            )
    return tok
