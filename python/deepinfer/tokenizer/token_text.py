"""A token's own text and raw bytes, as logprobs report them.

A byte-level BPE token (every DeepSeek tokenizer) may hold part of a UTF-8 character, so decoding it alone can give
U+FFFD: ``TokenText`` reads the token's bytes from its byte-level spelling instead, and falls back to ``decode`` for
tokens that are not spelled in that alphabet (added and special tokens).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["TokenText"]

_MAX_CACHED = 200_000


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character that stands for each byte -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenText:
    """A token's text and raw bytes, for logprobs (a byte-level token may hold part of a UTF-8 character)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = None
        try:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
        except Exception:
            pass
        decoder = _byte_decoder()
        if isinstance(piece, str) and piece and all(ch in decoder for ch in piece):
            raw = bytes(decoder[ch] for ch in piece)
            text = raw.decode("utf-8", errors="replace")
        else:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            raw = text.encode("utf-8")
        value = (text, list(raw))
        if len(self._cache) < _MAX_CACHED:
            self._cache[token_id] = value
        return value
