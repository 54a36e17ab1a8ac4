"""Where a long document is cut into the pieces that are encoded one by one, and why the tokens stay the same.

A document longer than the bound ``limit`` (characters) is cut into pieces of at most ``limit`` characters. Each
cut is made just before the last space (U+0020) that follows a non-whitespace character within the first
``limit + 1`` characters of what is left. Every common pre-tokenizer splits there anyway: GPT-2's byte-level regex
and the cl100k / o200k / Llama 3 regexes start a new word at a space that follows a non-space, SentencePiece's
metaspace turns the space into the ``▁`` that starts the next word, and ``char`` tokenizers isolate every
character. So encoding the pieces one after the other gives the ids of encoding the whole document.

Only a run of more than ``limit`` characters without such a space is cut at exactly ``limit`` characters; for
``char`` that changes nothing, a BPE may merge differently across that one cut (a few ids differ there, none
elsewhere). A tokenizer whose normalizer prepends a character to every text it is given (Llama 2's and Mistral's
``Prepend("▁")``) adds it at each cut as well.

The cuts depend only on the document's text and ``limit``: not on how the file was read, so a text file, a JSON
Lines record, a Parquet row and a ``datasets`` row holding the same text are cut alike.
"""

from __future__ import annotations

import re
from typing import Iterator

# A space whose previous character is not whitespace, found from the end by searching the reversed text.
_CUT_REVERSED = re.compile(r" (?=\S)")


def cut_point(text: str, limit: int) -> int:
    """Length of the first piece of ``text`` (``len(text) > limit``): before the last space that follows a
    non-whitespace character among the first ``limit + 1`` characters, else ``limit``; in ``1..limit``."""
    window = text[: limit + 1]
    m = _CUT_REVERSED.search(window[::-1])
    cut = None if m is None else len(window) - 1 - m.start()
    return cut if cut else limit


def split_text(text: str, limit: int) -> list[str]:
    """``text`` cut into pieces of at most ``limit`` characters (see the module docstring); at least one piece
    (``[""]`` for no text). ``"".join(split_text(t, n)) == t``."""
    pieces, start = [], 0
    while len(text) - start > limit:
        cut = cut_point(text[start : start + limit + 1], limit)
        pieces.append(text[start : start + cut])
        start += cut
    pieces.append(text[start:])
    return pieces


class TextCutter:
    """Cuts a document that arrives in chunks into the pieces :func:`split_text` makes of the whole of it.

    ``feed(chunk)`` yields ``(text, offset)`` for each piece complete so far (``offset``: characters of the
    document before it); ``finish()`` returns the last one. At most ``limit`` characters plus one chunk are held.
    """

    def __init__(self, limit: int):
        self.limit, self.buf, self.offset = limit, "", 0

    def feed(self, chunk: str) -> Iterator[tuple[str, int]]:
        """The pieces completed by ``chunk``, each with its offset in the document."""
        self.buf += chunk
        while len(self.buf) > self.limit:
            cut = cut_point(self.buf, self.limit)
            yield self.buf[:cut], self.offset
            self.buf, self.offset = self.buf[cut:], self.offset + cut

    def finish(self) -> tuple[str, int]:
        """The last piece (possibly empty) and its offset."""
        return self.buf, self.offset
