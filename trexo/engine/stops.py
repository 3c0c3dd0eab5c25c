"""Stop sequences over streamed text: cut before the first stop, never leak part of one.

Pure logic, no MLX. Generation text arrives in pieces that can split a stop string anywhere,
so text that could be the start of a stop string is held back until the next piece shows
whether it is one.

Semantics: the output ends at the earliest point where any stop string has been completely
produced, and the text is cut right before that occurrence. (When several stop strings end at
the same point, the longest, i.e. the one starting earliest, wins.) This is the only rule a
streaming generator can follow without waiting for text it will never produce, and it does not
depend on how the text is split into pieces.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen
class StopResult:
    """What `StopMatcher.feed` released: `text` is safe to emit; `stopped` ends the output."""

    text: str
    stopped: bool = False
    matched: str | None = None
    """The stop string that ended the output (when `stopped`)."""


def _held_suffix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def _earliest_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The stop occurrence that *ends* first in `text` (longest on ties): (start, stop)."""
    best: tuple[int, str] | None = None
    best_end = 0
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        end = start + len(stop)
        if best is None or end < best_end or (end == best_end and start < best[0]):
            best, best_end = (start, stop), end
    return best


class StopMatcher:
    """Feed text pieces in order; emit what `feed` returns, then `flush()` if never stopped.

    The text held back at any time is a proper prefix of some stop string, so it is never
    longer than the longest stop string minus one character. Empty stop strings are ignored.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(sorted({s for s in stops if s}))
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def held(self) -> str:
        """Text received but not yet released."""
        return self._held

    def feed(self, piece: str) -> StopResult:
        """Add the next piece of output; return the text that is now known to be output."""
        if self._stopped:
            raise RuntimeError("StopMatcher.feed() after a stop sequence was found")
        if not self._stops:
            return StopResult(piece)
        text = self._held + piece
        found = _earliest_stop(text, self._stops)
        if found is not None:
            cut, stop = found
            self._held = ""
            self._stopped = True
            return StopResult(text[:cut], stopped=True, matched=stop)
        held = _held_suffix_len(text, self._stops)
        self._held = text[len(text) - held :]
        return StopResult(text[: len(text) - held])

    def flush(self) -> str:
        """The output ended without a stop: release what was held back."""
        held, self._held = self._held, ""
        return held


def cut_at_stop(text: str, stops: Iterable[str]) -> tuple[str, bool]:
    """The whole-text answer `StopMatcher` gives piece by piece: (output, stopped)."""
    matcher = StopMatcher(stops)
    result = matcher.feed(text)
    return (result.text, True) if result.stopped else (result.text + matcher.flush(), False)
