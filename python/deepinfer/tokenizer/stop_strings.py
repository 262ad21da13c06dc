"""Stop strings over streamed text.

``find_stop`` applies stop strings to a stream of deltas: it holds back a tail that could still
grow into a stop string and cuts the text at the first stop string found. ``first_completed_stop``
names the stop string that rule stops at, for a response's ``stop_reason``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["find_stop", "first_completed_stop", "held_back_length"]


def _held_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
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


def first_completed_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string that completes first in `text` (find_stop's rule: earliest end, then earliest start)."""
    hits = [(i + len(s), i, s) for s in stops if s and (i := text.find(s)) != -1]
    return min(hits)[2] if hits else None
