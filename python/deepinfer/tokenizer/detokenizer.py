"""Streaming detokenization.

``IncrementalDetokenizer`` turns the token ids a request generates, a few at a time, into text
deltas. It keeps two offsets into the token list: ``prefix_offset`` (start of a short context
window whose text has already been emitted) and ``read_offset`` (end of that window, always on a
character boundary). Each step decodes only ``ids[prefix_offset:]`` - the context plus the tokens
not yet settled - and emits what extends past the text already emitted, so the cost per token does
not grow with the output length.

A byte-level BPE token can end in the middle of a UTF-8 character (emoji, CJK, ... are split over
several tokens); decoding such a prefix yields U+FFFD at the end. Trailing U+FFFD characters are
held back until the character completes (the text before them is emitted at once), so no delta
ever carries a broken character that a later token would have completed. When tokens keep ending
inside characters, ``read_offset`` moves to the last token boundary that ends on a character;
when the U+FFFDs are real (invalid bytes, or a literal U+FFFD) they are released after a few
tokens, at a boundary at least three tokens back (no incomplete character can straddle it).
After ``flush()`` the concatenated deltas equal ``tokenizer.decode(output_ids,
skip_special_tokens=...)`` for byte-level tokenizers (every DeepSeek model). Tokenizers whose
decoder strips a leading space (SentencePiece "▁") keep it here, because the prompt's last tokens
give the output its context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"
# Prompt tokens decoded as context ahead of the first output token.
_CONTEXT_TOKENS = 6
# Pending (unsettled) tokens tolerated before looking for a settled boundary among them. A UTF-8
# character has at most 4 bytes, so an incomplete one occupies at most the last 3 tokens.
_MAX_PENDING_TOKENS = 6
_MAX_INCOMPLETE_TOKENS = 3


class IncrementalDetokenizer:
    """Text deltas for a stream of generated token ids.

    ``tokenizer`` needs ``decode(ids, skip_special_tokens=...) -> str`` (a
    :class:`deepinfer.tokenizer.Tokenizer`, or anything shaped like it).
    """

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int] = (), skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        prompt = list(prompt_token_ids)
        # Keep a few prompt tokens as context, unless they end in an incomplete character (then
        # the output's first bytes would complete a character that belongs to the prompt).
        context = prompt[-_CONTEXT_TOKENS:]
        context_text = self._decode(context) if context else ""
        if context_text.endswith(_REPLACEMENT):
            context, context_text = [], ""
        self._ids: list[int] = context
        self._num_context = len(context)
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = context_text  # decode(ids[prefix_offset:read_offset])
        self._emitted = len(context_text)  # chars of decode(ids[prefix_offset:]) already emitted
        self._text_parts: list[str] = []
        self._finished = False
        # The fixed text of a token, where the tokenizer knows it (deepinfer's Tokenizer.token_text; other
        # tokenizers: always decoded).
        self._token_text = getattr(tokenizer, "token_text", None)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[self._num_context:]

    @property
    def text(self) -> str:
        """All text emitted so far (by ``step`` and ``flush``)."""
        if len(self._text_parts) > 1:
            self._text_parts = ["".join(self._text_parts)]
        return self._text_parts[0] if self._text_parts else ""

    def step(self, new_token_ids: Iterable[int] | int) -> str:
        """Add generated token ids; return the newly settled text (possibly '')."""
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.step() after flush()")
        if isinstance(new_token_ids, int):
            new_token_ids = (new_token_ids,)
        elif not isinstance(new_token_ids, (list, tuple)):
            new_token_ids = list(new_token_ids)
        if len(new_token_ids) == 1 and self._token_text is not None and self._read_offset == len(self._ids) \
                and self._emitted == len(self._prefix_text):
            # Everything so far is settled and emitted, and the token's text is fixed (Tokenizer.token_text): the
            # window would decode to prefix_text + that text, so the step's outcome is known without decoding.
            text = self._token_text(new_token_ids[0])
            if text is not None:
                self._ids.append(new_token_ids[0])
                self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
                self._prefix_text = text
                self._emitted = len(text)
                self._text_parts.append(text)
                return text
        self._ids.extend(new_token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Release any held-back text (call once, when the request finishes)."""
        if self._finished:
            return ""
        delta = self._advance(final=True)
        self._finished = True
        return delta

    def _settle(self, k: int, window_text: str | None = None) -> None:
        """Make ``ids[read_offset:k]`` the new context window (its text is all emitted).

        ``window_text``, when known, is ``decode(ids[prefix_offset:k])``.
        """
        # decode(ids[prefix_offset:]) == prefix_text + decode(ids[read_offset:]) because
        # read_offset is a character boundary, so re-base everything on read_offset.
        old_prefix_len = len(self._prefix_text)
        self._emitted -= old_prefix_len
        self._prefix_offset, self._read_offset = self._read_offset, k
        if window_text is not None:
            self._prefix_text = window_text[old_prefix_len:]
        else:
            self._prefix_text = self._decode(self._ids[self._prefix_offset:k])

    def _advance(self, final: bool) -> str:
        ids = self._ids
        if self._read_offset == len(ids):
            return ""
        window = self._decode(ids[self._prefix_offset:])
        end = len(window)
        held = not final and window.endswith(_REPLACEMENT)
        if held:
            end = len(window.rstrip(_REPLACEMENT))
        delta = window[self._emitted:end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        if not held:
            self._settle(len(ids), window)
        elif len(ids) - self._read_offset > _MAX_PENDING_TOKENS:
            delta += self._unstick(window)
        if delta:
            self._text_parts.append(delta)
        return delta

    def _unstick(self, window: str) -> str:
        """Many tokens pending behind a trailing U+FFFD: move ``read_offset`` to the last token
        boundary that is safe to settle on, releasing real U+FFFDs (invalid bytes) before it."""
        ids = self._ids
        for k in range(len(ids) - 1, self._read_offset, -1):
            text = self._decode(ids[self._prefix_offset:k])
            if not text.endswith(_REPLACEMENT):
                # Ends on a whole character, and was emitted already (it precedes the held tail).
                self._settle(k, text)
                return ""
            # Ends in U+FFFD. Safe to cut here if the cut changes nothing now: with at least
            # three tokens after k, no incomplete character can straddle k and complete later.
            if len(ids) - k >= _MAX_INCOMPLETE_TOKENS and text + self._decode(ids[k:]) == window:
                delta = text[self._emitted:] if len(text) > self._emitted else ""
                self._emitted = max(self._emitted, len(text))
                self._settle(k, text)
                return delta
        return ""
