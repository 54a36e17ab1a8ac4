"""Tokenizers for training data, all stored in one format: a Hugging Face ``tokenizers`` ``tokenizer.json``.

A tokenizer is named by a *spec* string:

* ``char``: nanoGPT's ``shakespeare_char`` tokenizer (karpathy/nanoGPT, ``data/shakespeare_char/prepare.py``). The
  vocabulary is the sorted set of the characters of the training text, id = rank in code-point order (tiny
  shakespeare: 65 symbols, ``'\\n'`` = 0, ``' '`` = 1, ...). Stored as a ``WordLevel`` model over single
  characters, a pre-tokenizer that isolates every character (line breaks included) and a ``Fuse`` decoder that
  joins the pieces with nothing between them.
* ``bpe:N``: byte-level BPE (GPT-2's scheme: Radford et al. 2019, "Language Models are Unsupervised Multitask
  Learners") trained with ``tokenizers``' ``BpeTrainer`` to at most ``N`` ids; ``N >= 256`` (the byte alphabet).
* a path: an existing ``tokenizer.json``, or a folder holding one (a Hugging Face model folder, a prepared dataset,
  a modkit checkpoint), used as is, with its special tokens.

Special tokens. Documents are kept apart by an end-of-text token (GPT-2's ``<|endoftext|>``; :data:`EOT_TOKEN`) and,
when asked, started by a begin-of-text token (:data:`BOS_TOKEN`, Llama 3's name). A trained tokenizer reserves them
as special tokens (:func:`train_tokenizer` ``special_tokens``): ``char`` gives them the ids after the characters (so
the character ids stay nanoGPT's), ``bpe:N`` the first ids. A given tokenizer's own are found by
:func:`special_tokens_of`: ``eos_token`` / ``bos_token`` of the folder's ``tokenizer_config.json`` (or
``special_tokens_map.json``), BERT's ``sep_token`` / ``cls_token`` when there is no ``eos_token``, else a special
token of a well-known name (:data:`EOT_NAMES`, :data:`BOS_NAMES`). :meth:`Tokenizer.save` writes a small
``tokenizer_config.json`` beside ``tokenizer.json`` naming them, so a run's checkpoint keeps them.

Document text is encoded *ordinarily* (:meth:`Tokenizer.encode_batch` ``ordinary=True``, as tiktoken's
``encode_ordinary`` and nanoGPT's OpenWebText preparation do): a literal ``<|endoftext|>`` inside a document is
text, never the separator.

Both trained kinds decode exactly: ``decode(encode(text)) == text`` for every text they can encode (any text for
``bpe:N``; text made of the vocabulary's characters for ``char``). The saved file is a plain ``tokenizer.json``, so
``modkit generate --tokenizer tokenizer.json`` and ``tokenizers.Tokenizer.from_file`` load it unchanged.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

from modkit.core.errors import DataError
from modkit.core.jsonio import JSONInputError, check_regular_file
from modkit.core.limits import MAX_VOCAB_SIZE

if TYPE_CHECKING:  # the annotation of token_bytes
    import numpy as np

#: largest tokenizer.json read (bytes); large published vocabularies take tens of MiB
MAX_TOKENIZER_BYTES = 256 * 2**20

#: File name of a tokenizer inside a folder (a prepared dataset, a checkpoint, a Hugging Face model).
TOKENIZER_FILE = "tokenizer.json"

#: Smallest ``N`` of ``bpe:N``: the 256 byte symbols every byte-level BPE starts from.
MIN_BPE_VOCAB = 256

_BPE_SPEC = re.compile(r"bpe(?::(.*))?", re.IGNORECASE)

#: The end-of-text token a trained tokenizer reserves (GPT-2's; nanoGPT's OpenWebText preparation appends it).
EOT_TOKEN = "<|endoftext|>"
#: The begin-of-text token a trained tokenizer reserves when documents are to start with one (Llama 3's name).
BOS_TOKEN = "<|begin_of_text|>"
#: Special tokens taken as end-of-text in a tokenizer that names none, in order: GPT-2 / Qwen, Llama 3, Llama 2 /
#: Mistral / T5-style, Gemma, BERT.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")
#: Special tokens taken as begin-of-text likewise: Llama 3, GPT-style, Llama 2 / Mistral, Gemma, BERT.
BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "[CLS]")
#: File beside ``tokenizer.json`` naming its special tokens (Hugging Face's name and keys).
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_MAP_FILE = "special_tokens_map.json"
#: Hugging Face's special-token keys: those a loaded tokenizer's files name are written back by :meth:`Tokenizer.save`
HF_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class UnknownTokenError(DataError):
    """The text holds a character (or word) the tokenizer's vocabulary lacks (a ``char`` or other word-level one).

    Attributes:
        piece: the character (or pre-tokenized word) with no id.
        position: its offset in the encoded text, in characters (0-based).
        index: for :meth:`Tokenizer.encode_batch`, which text of the batch (0-based); ``None`` for one text.
    """

    def __init__(self, message: str, *, piece: str, position: int, index: int | None = None):
        super().__init__(message)
        self.piece, self.position, self.index = piece, position, index


def describe_char(ch: str) -> str:
    """``'é' (U+00E9 LATIN SMALL LETTER E WITH ACUTE)``: a character as an error message shows it."""
    if len(ch) != 1:
        return repr(ch)
    name = unicodedata.name(ch, None) or ("a control character" if unicodedata.category(ch) == "Cc" else "unnamed")
    return f"{ch!r} (U+{ord(ch):04X} {name})"


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with the few calls training needs, and the spec it was made from.

    Encoding adds no special tokens and decoding keeps them, so ``decode(encode(text)) == text`` whenever the
    underlying tokenizer is lossless (both kinds :func:`train_tokenizer` makes are).

    Attributes:
        backend: the wrapped ``tokenizers.Tokenizer`` (what ``tokenizer.json`` holds).
        spec: what it was made from: ``"char"``, ``"bpe:512"``, or the path of the file it was loaded from.
        vocab_size: ``1 + the largest id`` (added tokens included): the ``vocab_size`` a model needs for it.
        eot, eot_id: the end-of-text token and its id (``None`` when the tokenizer has none).
        bos, bos_id: the begin-of-text token and its id (``None`` when it has none).
        hf_special: ``{Hugging Face key: token}`` the files it was loaded from named (``pad_token``, ``bos_token``,
            ...; :data:`HF_SPECIAL_KEYS`), kept by :meth:`save` whether or not documents use them.
    """

    def __init__(self, backend: tokenizers.Tokenizer, spec: str, *, eot: str | None = None, bos: str | None = None):
        self.backend = backend
        self.spec = str(spec)
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        found = special_tokens_of(backend)
        self.eot: str | None = None
        self.bos: str | None = None
        self.eot_id: int | None = None
        self.bos_id: int | None = None
        self.set_special(eot=eot if eot is not None else found[0], bos=bos if bos is not None else found[1])
        self.hf_special: dict[str, str] = {}
        self._ordinary: tokenizers.Tokenizer | None = None

    def set_special(self, *, eot: str | None = ..., bos: str | None = ...) -> None:  # type: ignore[assignment]
        """Name the end-of-text and/or begin-of-text token (``None``: none; an argument left out is kept).

        Raises:
            DataError: a token that is not in the vocabulary.
        """
        for name, token in (("eot", eot), ("bos", bos)):
            if token is ...:
                continue
            token_id = None if token is None else self.backend.token_to_id(token)
            if token is not None and token_id is None:
                raise DataError(
                    f"{name} token {token!r} is not in the vocabulary of tokenizer {self.spec!r}; name one of its "
                    f"special tokens ({', '.join(repr(t) for t in self.special_tokens()[:8]) or 'it has none'})"
                )
            setattr(self, name, token)
            setattr(self, f"{name}_id", token_id)

    def special_tokens(self) -> list[str]:
        """The tokenizer's special (added) tokens, in id order."""
        added = self.backend.get_added_tokens_decoder()
        return [added[i].content for i in sorted(added) if added[i].special]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added).

        Raises:
            UnknownTokenError: (a ``DataError``, so a ``ValueError``) a character the vocabulary lacks, named with
                its position; the fix is a tokenizer made from text that holds it, or a byte-level one.
        """
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # tokenizers raises a bare Exception
            raise self._encode_error(text, exc) from None

    def encode_batch(self, texts: Sequence[str], *, ordinary: bool = False) -> list[list[int]]:
        """Token ids of each text (several threads in the Rust library, no offsets); the same ids as ``encode``.

        Args:
            texts: the texts.
            ordinary: encode special tokens written in the text as ordinary text (a document that quotes
                ``<|endoftext|>`` gets the ids of those characters, not the separator's id); what data preparation
                uses. Default: special tokens in the text are recognised, as Hugging Face tokenizers do.

        Raises:
            UnknownTokenError: as :meth:`encode`, with ``index`` = the first text that cannot be encoded.
        """
        backend = self._ordinary_backend() if ordinary else self.backend
        try:
            return [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        except Exception as exc:  # noqa: BLE001 - find which text failed, and why
            for i, text in enumerate(texts):
                try:
                    self.encode(text)
                except UnknownTokenError as unknown:
                    unknown.index = i
                    raise
            raise DataError(f"tokenizer {self.spec!r} cannot encode the batch: {exc}") from None

    def _ordinary_backend(self) -> tokenizers.Tokenizer:
        if self._ordinary is None:
            self._ordinary = tokenizers.Tokenizer.from_str(self.backend.to_str())
            self._ordinary.encode_special_tokens = True
        return self._ordinary

    def token_bytes(self) -> "np.ndarray":
        """UTF-8 bytes of text each id stands for, ``[vocab_size]`` int64: the denominator of bits per byte.

        Byte-level BPE (a ``ByteLevel`` decoder): each symbol of a token is one byte, so the count is exact for any
        span of ids, a UTF-8 character split across tokens included. Other tokenizers: the UTF-8 length of the
        token decoded alone, exact for ``char``; for WordPiece or SentencePiece vocabularies the spaces the decoder
        puts between words are not counted. Special tokens (end-of-text, ...) and unused ids count 0: they are no
        text.
        """
        import numpy as np

        out = np.zeros(self.vocab_size, dtype=np.int64)
        special = {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        decoder = (json.loads(self.backend.to_str()).get("decoder") or {}).get("type")
        for token, i in self.backend.get_vocab(with_added_tokens=True).items():
            if i in special:
                continue
            out[i] = (
                len(token)
                if decoder == "ByteLevel"
                else len(self.backend.decode([i], skip_special_tokens=False).encode("utf-8"))
            )
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids (special tokens kept, so nothing encoded is lost).

        Raises:
            DataError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise DataError(
                f"token id {bad} is outside the vocabulary of tokenizer {self.spec!r} (ids 0..{self.vocab_size - 1})"
            )
        return self.backend.decode(ids, skip_special_tokens=False)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` to ``path`` (a file name, or an existing folder to write it into); returns the file.

        When the file is named ``tokenizer.json`` and the tokenizer has an end-of-text or begin-of-text token, a
        ``tokenizer_config.json`` naming them (``eos_token``, ``bos_token``; Hugging Face's keys, so transformers'
        ``AutoTokenizer`` loads the folder too) is written beside it, with every other special token the files it
        was loaded from named (:attr:`hf_special`: ``pad_token``, a ``bos_token`` documents do not start with, ...).
        """
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        # written here, not by the library, which takes only UTF-8 paths (a folder named in other bytes is fine)
        path.write_text(self.backend.to_str(pretty=True), encoding="utf-8")
        config = self.special_config()
        if path.name == TOKENIZER_FILE and config is not None:
            (path.parent / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return path

    def special_config(self) -> dict | None:
        """The ``tokenizer_config.json`` naming the special tokens (:meth:`save`), or ``None`` when it names none:
        ``eos_token`` / ``bos_token`` (:attr:`eot` / :attr:`bos`, else the loaded files' own) and every other
        :data:`HF_SPECIAL_KEYS` token the loaded files named."""
        named = {**self.hf_special}
        named.update({k: v for k, v in (("eos_token", self.eot), ("bos_token", self.bos)) if v is not None})
        if not named:
            return None
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{k: named[k] for k in HF_SPECIAL_KEYS if k in named},
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
        }

    def __repr__(self) -> str:
        return f"Tokenizer(spec={self.spec!r}, vocab_size={self.vocab_size})"

    def _encode_error(self, text: str, exc: Exception) -> DataError:
        vocab = self.backend.get_vocab(with_added_tokens=True)
        pre = self.backend.pre_tokenizer
        try:
            pieces = pre.pre_tokenize_str(text) if pre is not None else [(text, (0, len(text)))]
        except Exception:  # noqa: BLE001 - text the library cannot take at all (a lone surrogate)
            return DataError(f"tokenizer {self.spec!r} cannot encode the text: {exc}")
        for piece, (start, _end) in pieces:
            if piece not in vocab:
                what = f"character {describe_char(piece)}" if len(piece) == 1 else f"text {piece!r}"
                return UnknownTokenError(
                    f"{what} at position {start} is not in the vocabulary of tokenizer {self.spec!r} "
                    f"({len(vocab)} entries); use a tokenizer made from text that holds it (`char` builds its "
                    f"vocabulary from the inputs) or a byte-level one (`bpe:N`) that encodes any text",
                    piece=piece,
                    position=start,
                )
        return DataError(f"tokenizer {self.spec!r} cannot encode the text: {exc}")


def _token_name(value) -> str | None:
    """A special token as a Hugging Face config gives it: a string, or an ``AddedToken`` dict with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens_of(backend: tokenizers.Tokenizer, folder: Path | None = None) -> tuple[str | None, str | None]:
    """``(end-of-text token, begin-of-text token)`` of a tokenizer (each ``None`` when it has none).

    Looked up in order: ``eos_token`` / ``bos_token`` of ``folder``'s ``tokenizer_config.json`` then
    ``special_tokens_map.json`` (BERT-style ``sep_token`` / ``cls_token`` when there is no ``eos_token``); then the
    tokenizer's special tokens with a name of :data:`EOT_NAMES` / :data:`BOS_NAMES`. A name not in the vocabulary
    is skipped.
    """
    eot = bos = None
    if folder is not None:
        for name in (TOKENIZER_CONFIG_FILE, _SPECIAL_MAP_FILE):
            file = folder / name
            try:
                config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
            except (OSError, ValueError):
                config = {}
            if not isinstance(config, dict):
                continue
            has_eos = "eos_token" in config
            for key in ("eos_token",) + (() if has_eos else ("sep_token",)):
                token = _token_name(config.get(key))
                if eot is None and token is not None and backend.token_to_id(token) is not None:
                    eot = token
            has_bos = "bos_token" in config
            for key in ("bos_token",) + (() if has_bos or has_eos else ("cls_token",)):
                token = _token_name(config.get(key))
                if bos is None and token is not None and backend.token_to_id(token) is not None:
                    bos = token
            if has_eos or has_bos or eot is not None:  # the first file that names them decides
                return eot, bos
    added = backend.get_added_tokens_decoder()
    special = {t.content for t in added.values() if t.special}
    eot = next((t for t in EOT_NAMES if t in special), None)
    bos = next((t for t in BOS_NAMES if t in special), None)
    return eot, bos


def char_tokenizer(chars: Iterable[str], special_tokens: Sequence[str] = ()) -> Tokenizer:
    """The ``char`` tokenizer over a set of characters: id = rank in sorted (code-point) order.

    Same ids as nanoGPT's ``shakespeare_char/prepare.py``: ``stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}``;
    ``special_tokens`` (e.g. :data:`EOT_TOKEN`) take the ids after the characters, in the order given.

    Raises:
        DataError: no characters.
    """
    vocab = sorted(set(chars))
    if not vocab:
        raise DataError("no text to build a `char` vocabulary from: the inputs are empty")
    backend = tokenizers.Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(vocab)}))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, \n too
    backend.decoder = decoders.Fuse()
    if special_tokens:
        backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return Tokenizer(backend, "char")


def _byte_symbols() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (Radford et al. 2019; the alphabet of
    ``tokenizers``' ``ByteLevel`` pre-tokenizer): printable Latin-1 bytes map to themselves, the other 68 to
    ``chr(256 + n)`` in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in keep}
    for n, b in enumerate(b for b in range(256) if b not in symbols):
        symbols[b] = chr(256 + n)
    return symbols


def byte_tokenizer() -> Tokenizer:
    """The ``bytes`` tokenizer: one token per UTF-8 byte, id = the byte's value (256 ids, no merges, no training).

    Encodes any text and decodes exactly (``decode(encode(text)) == text``); fits every model with
    ``vocab_size >= 256``. Stored as GPT-2's byte-level scheme with an empty merge list: a ``BPE`` model over the
    256 byte symbols, the ``ByteLevel`` pre-tokenizer (no prefix space, no word split) and decoder.
    """
    vocab = {sym: b for b, sym in _byte_symbols().items()}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, "bytes")


def check_fits(tokenizer: Tokenizer, vocab_size: int) -> str | None:
    """Whether ``tokenizer``'s ids fit a model of ``vocab_size``: ``None`` when the sizes agree, a warning text
    naming both when the model has more ids (usual when a vocabulary is padded to a round size, e.g. nanoGPT's
    50,304 for GPT-2's 50,257, and a sign of the wrong tokenizer otherwise).

    Raises:
        DataError: the tokenizer has more ids than the model (an id ``>= vocab_size`` has no embedding), naming both.
    """
    if tokenizer.vocab_size > vocab_size:
        raise DataError(
            f"tokenizer {tokenizer.spec!r} has {tokenizer.vocab_size:,} ids but the model's vocab_size is "
            f"{vocab_size:,}: ids {vocab_size:,} and above have no embedding; use the tokenizer the model was made for"
        )
    if tokenizer.vocab_size < vocab_size:
        return (
            f"tokenizer {tokenizer.spec!r} has {tokenizer.vocab_size:,} ids and the model's vocab_size is "
            f"{vocab_size:,}: the model's ids {tokenizer.vocab_size:,} to {vocab_size - 1:,} have no text; fine for "
            "a vocabulary padded to a round size, otherwise not the tokenizer the model was made for"
        )
    return None


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``("char", None)``, ``("bpe", N)`` or ``("path", None)`` for a tokenizer spec string.

    Raises:
        DataError: ``bpe`` without a size, a size that is not an integer, one below 256 or over 2**24
            (:data:`~modkit.core.limits.MAX_VOCAB_SIZE`).
    """
    spec = str(spec).strip()
    if spec.lower() == "char":
        return "char", None
    m = _BPE_SPEC.fullmatch(spec)
    if m:
        size = m.group(1)
        if size is None or not re.fullmatch(r"[0-9]+", size.strip()):
            raise DataError(f"tokenizer {spec!r}: bpe needs a vocabulary size, an integer, e.g. bpe:512")
        n = int(size)
        if n < MIN_BPE_VOCAB:
            raise DataError(
                f"tokenizer {spec!r}: vocabulary too small: a byte-level BPE needs vocab_size >= {MIN_BPE_VOCAB} "
                f"(its byte alphabet), got {n}; use e.g. bpe:512"
            )
        if n > MAX_VOCAB_SIZE:
            raise DataError(
                f"tokenizer {spec!r}: vocabulary too large: {n:,} is over {MAX_VOCAB_SIZE:,}, modkit's bound on vocab_size "
                "(modkit.core.limits.MAX_VOCAB_SIZE)"
            )
        return "bpe", n
    return "path", None


def train_tokenizer(spec: str, texts: Iterable[str], *, special_tokens: Sequence[str] = ()) -> Tokenizer:
    """Make a ``char`` or ``bpe:N`` tokenizer from texts, read once as a stream (never all held at once).

    Args:
        spec: ``"char"`` or ``"bpe:N"`` (``N >= 256``).
        texts: any iterable of strings (pieces of a corpus, documents).
        special_tokens: tokens to reserve (e.g. :data:`EOT_TOKEN`, :data:`BOS_TOKEN`): ``char`` gives them the ids
            after the characters, ``bpe:N`` the first ids (within ``N``). Text is never merged into them.

    Returns:
        a :class:`Tokenizer` whose ``spec`` is ``spec``. A ``bpe:N`` trained on little text may have fewer than
            ``N`` ids (the trainer stops when no pair is left to merge); ``vocab_size`` says how many.

    Raises:
        DataError: a spec that is neither ``char`` nor ``bpe:N`` (use :func:`load_tokenizer` for a file), a BPE
            size below 256, or no text.
    """
    kind, size = parse_spec(spec)
    if kind == "char":
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        return char_tokenizer(chars, special_tokens)
    if kind == "bpe":
        backend = tokenizers.Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
            special_tokens=[tokenizers.AddedToken(t, special=True, normalized=False) for t in special_tokens],
        )
        seen = [False]

        def tracked():
            for text in texts:
                seen[0] = seen[0] or bool(text)
                yield text

        backend.train_from_iterator(tracked(), trainer)
        if not seen[0]:
            raise DataError(f"no text to train tokenizer {spec!r} on: the inputs are empty")
        return Tokenizer(backend, f"bpe:{size}")
    raise DataError(
        f"tokenizer {spec!r}: train_tokenizer makes `char` or `bpe:N`; load a tokenizer file with load_tokenizer"
    )


def load_tokenizer(path: str | Path, *, spec: str | None = None) -> Tokenizer:
    """Load a ``tokenizer.json`` (or a folder holding one), e.g. a prepared dataset's or a Hugging Face model's.

    Args:
        path: the file, or a folder with ``tokenizer.json`` in it (a Hugging Face model folder: its
            ``tokenizer_config.json`` names the special tokens; see :func:`special_tokens_of`).
        spec: what the tokenizer was made from (e.g. ``"char"`` from a dataset's ``meta.json``); default: the path.

    Padding and truncation stored in the file are switched off, and encoding adds no special tokens (a BERT
    post-processor's ``[CLS] ... [SEP]`` is not applied): text is encoded as it is.

    Raises:
        DataError: no such file, a path that holds a NUL byte or is not a regular file (a FIFO, a device) or one
            over 256 MiB, or a file ``tokenizers`` cannot read.
    """
    if "\x00" in str(path):
        raise DataError(f"tokenizer {str(path)!r}: not a usable path (it holds a NUL byte); check the tokenizer path")
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.exists():
        where = f"{path} holds no {TOKENIZER_FILE}" if path.is_dir() else f"{path}: no such file"
        hint = ""
        if path.is_dir() and any(
            (path / n).is_file() for n in ("vocab.txt", "tokenizer.model", "vocab.json", TOKENIZER_CONFIG_FILE)
        ):
            hint = (
                " (this model folder has only a slow tokenizer: write its tokenizer.json with transformers, "
                "AutoTokenizer.from_pretrained(folder).save_pretrained(folder))"
            )
        raise DataError(f"{where}{hint}; give a tokenizers tokenizer.json (or a folder holding one), `char` or `bpe:N`")
    try:  # a regular file of bounded size: a FIFO or /dev/zero is refused, not read
        check_regular_file(file, max_bytes=MAX_TOKENIZER_BYTES)
    except JSONInputError as exc:
        raise DataError(
            f"{exc}; give a tokenizers tokenizer.json (or a folder holding one), `char` or `bpe:N`"
        ) from None
    try:
        backend = tokenizers.Tokenizer.from_str(file.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise DataError(
            f"{file}: not a tokenizers tokenizer.json ({exc}); save one with tokenizers' Tokenizer.save"
        ) from None
    # a model's tokenizer.json may pad (MiniLM: to 128) or truncate its inputs; text for training or a prompt is
    # encoded as it is, never padded with pad ids or cut
    backend.no_padding()
    backend.no_truncation()
    eot, bos = special_tokens_of(backend, file.parent)
    tok = Tokenizer(backend, spec if spec is not None else str(file), eot=eot, bos=bos)
    tok.hf_special = hf_special_tokens(backend, file.parent)
    return tok


def hf_special_tokens(backend: tokenizers.Tokenizer, folder: Path) -> dict[str, str]:
    """``{key: token}`` for each :data:`HF_SPECIAL_KEYS` key that ``folder``'s ``tokenizer_config.json`` or
    ``special_tokens_map.json`` names with a token in the vocabulary (the first file naming a key decides)."""
    found: dict[str, str] = {}
    for name in (TOKENIZER_CONFIG_FILE, _SPECIAL_MAP_FILE):
        try:
            config = json.loads((folder / name).read_text(encoding="utf-8")) if (folder / name).is_file() else {}
        except (OSError, ValueError):
            config = {}
        for key in HF_SPECIAL_KEYS if isinstance(config, dict) else ():
            token = _token_name(config.get(key))
            if key not in found and token is not None and backend.token_to_id(token) is not None:
                found[key] = token
    return found


def vocab_difference(ours: Tokenizer, theirs: Tokenizer, our_name: str, their_name: str) -> Optional[str]:
    """``None`` when the two tokenizers number every token alike (vocabularies with added tokens equal), else a
    phrase naming the first token (in sorted order) ``theirs`` numbers differently, e.g. ``'a' is id 3 in the data,
    id 5 in the checkpoint``, or the two sizes. Two char tokenizers of different texts share ids but not tokens:
    data tokenized with one means other tokens to a model trained with the other."""
    a = ours.backend.get_vocab(with_added_tokens=True)
    b = theirs.backend.get_vocab(with_added_tokens=True)
    if a == b:
        return None
    for t in sorted(b):
        if b[t] != a.get(t):
            role = f"id {a[t]}" if t in a else "not a token"
            return f"{t!r} is id {b[t]} in {their_name}, {role} in {our_name}"
    return f"{our_name}'s tokenizer has {len(a):,} tokens, {their_name}'s {len(b):,}"
