"""Stop strings over streamed text.

``find_stop`` applies stop strings to a stream of deltas: it holds back a tail that could still
grow into a stop string and cuts the text at the first stop string found. ``first_completed_stop``
names the stop string that rule stops at, for a response's ``stop_reason``. ``StopStringMatcher`` applies the
same rule to a whole stream while keeping only the tail of the text a stop string can still end in, so a token costs
the same however long the output already is.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopStringMatcher", "find_stop", "first_completed_stop", "held_back_length"]


def _held_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
    best, n = 0, len(text)
    for s in stops:
        limit = min(len(s) - 1, n)
        if limit <= best:
            continue
        # Such a tail starts with s[0]: only those places are tried, leftmost (the longest tail) first.
        p = text.find(s[0], n - limit)
        while p != -1 and n - p > best:
            if s.startswith(text[p:]):
                best = n - p
                break
            p = text.find(s[0], p + 1)
    return best


def held_back_length(text: str, stop_strings: Sequence[str]) -> int:
    """How many trailing characters of ``text`` ``find_stop`` keeps back (may start a stop string)."""
    return _held_len(text, [s for s in stop_strings if s])


def find_stop(
    text_so_far: str,
    new_delta: str,
    stop_strings: Sequence[str],
    include_stop: bool = False,
    *,
    final: bool = False,
) -> tuple[str, bool]:
    """Apply stop strings to one streamed delta.

    ``text_so_far`` is all generated text before ``new_delta`` (what earlier calls were given,
    not what they returned). Returns ``(emit_text, stopped)``: the text to send to the client now,
    and whether a stop string was found. Stopped: the output ends right before the stop string
    that completes first (right after it with ``include_stop``); the result is the same however
    the text was split into deltas. Not stopped: a tail that could be the start of a
    stop string is held back; it is released by the call that proves it is not one, or by a call
    with ``final=True`` (the request finished for another reason; ``new_delta`` may be '').
    Every call uses the same rule, so the text emitted so far is always
    ``text_so_far[:len(text_so_far) - held_back_length(text_so_far, stop_strings)]``.
    """
    stops = [s for s in stop_strings if s]
    if not stops:
        return new_delta, False
    full = text_so_far + new_delta
    emitted = len(text_so_far) - _held_len(text_so_far, stops)
    # A stop string not found before must end inside new_delta.
    search_from = max(0, len(text_so_far) - max(len(s) for s in stops) + 1)
    # The stop string that completes first wins (then the one starting first): the result does
    # not depend on how the text was split into deltas.
    best = None
    for s in stops:
        i = full.find(s, search_from)
        if i != -1 and (best is None or (i + len(s), i) < (best[0] + len(best[1]), best[0])):
            best = (i, s)
    if best is not None:
        hit, hit_stop = best
        cut = hit + len(hit_stop) if include_stop else hit
        return full[emitted:max(cut, emitted)], True
    if final:
        return full[emitted:], False
    return full[emitted:len(full) - _held_len(full, stops)], False


class StopStringMatcher:
    """find_stop over one stream of deltas, each fed once, in order. A stop string found later ends within the last
    (longest stop - 1) characters of the text before its delta and the delta, and the text held back lies there too,
    so the matcher keeps only that tail: each delta gives what find_stop on the whole text gives (tested against it)."""

    def __init__(self, stop_strings: Sequence[str], include_stop: bool = False) -> None:
        self._stops = [s for s in stop_strings if s]
        if not self._stops:
            raise ValueError("StopStringMatcher needs a non-empty stop string")
        self._include = include_stop
        self._keep = max(len(s) for s in self._stops) - 1
        self._tail = ""   # the last _keep characters of the text so far
        self._held = 0    # how many of them are held back (may start a stop string)
        self.stop_reason: str | None = None  # the stop string found, once one is

    def feed(self, delta: str, *, final: bool = False) -> tuple[str, bool]:
        """(the text to emit now, whether a stop string was found), as find_stop(all text so far, delta)."""
        window = self._tail + delta
        emitted = len(self._tail) - self._held
        best = None  # (end, start, stop): the stop string that completes first, then the one starting first
        for s in self._stops:
            i = window.find(s)
            if i != -1 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is not None:
            self.stop_reason = best[2]
            cut = best[0] if self._include else best[1]
            return window[emitted:max(cut, emitted)], True
        if final:
            self._tail, self._held = "", 0
            return window[emitted:], False
        held = _held_len(window, self._stops)
        out = window[emitted:len(window) - held]
        self._tail = window[len(window) - self._keep:] if len(window) > self._keep else window
        self._held = held
        return out, False


def first_completed_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string that completes first in `text` (find_stop's rule: earliest end, then earliest start)."""
    hits = [(i + len(s), i, s) for s in stops if s and (i := text.find(s)) != -1]
    return min(hits)[2] if hits else None
