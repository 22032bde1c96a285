"""Stop strings cut from streamed text: where the earliest one starts, and what may still grow into one.

Pure Python (no MLX import); the result never depends on how the text is split into deltas.
"""

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple


def longest_partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker.

    That suffix may still grow into a marker, so it must be held back.
    """
    best = 0
    for marker in markers:
        upto = min(len(marker) - 1, len(text))
        for n in range(upto, best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def truncate_at_stop(text: str, stops: Sequence[str]) -> Tuple[str, bool]:
    """The whole text cut at the earliest occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


@dataclass
class StopMatcher:
    """Streaming stop-string cutter.

    mlx-lm's StopSequences matches token ids, but a stop string can start or end
    inside a token, so this one works on the decoded text. `feed` returns the
    text that is safe to send; a tail that could start a stop string is held
    back until it cannot. Once a stop matched, nothing more is ever returned.
    """

    stops: List[str]
    _held: str = ""
    stopped: bool = False
    _stops: List[str] = field(init=False)

    def __post_init__(self):
        self._stops = [s for s in dict.fromkeys(self.stops) if s]

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self._held + text
        cut, found = truncate_at_stop(buf, self._stops)
        # A longer stop that began before the match may still complete and
        # would then be the earliest one: wait for it before deciding.
        pending = len(buf) - longest_partial_suffix(buf, self._stops)
        if found and pending >= len(cut):
            self._held, self.stopped = "", True
            return cut
        self._held = buf[pending:]
        return buf[:pending]

    def finalize(self) -> str:
        """The held-back tail, cut at a stop it holds, once the stream has ended."""
        if self.stopped:
            return ""
        out, self.stopped = truncate_at_stop(self._held, self._stops)
        self._held = ""
        return out
