"""Token ids of one request to channel deltas: detokenizer, stop matcher, output router in a row.

Pure Python, no MLX import (the detokenizer is mlx-lm's, duck-typed).
"""

import bisect
from typing import List, Optional, Sequence

try:  # imported as common.output_router
    from .output_router import Delta, OutputRouter
except ImportError:  # imported flat, as LocalAI's backends do
    from output_router import Delta, OutputRouter
try:  # imported as common.stop_matcher
    from .stop_matcher import StopMatcher
except ImportError:  # imported flat, as LocalAI's backends do
    from stop_matcher import StopMatcher


class TextPipeline:
    """Token ids of one request -> channel deltas that are safe to send.

    The streaming detokenizer (mlx-lm's, duck-typed: add_token / finalize /
    last_segment) never splits a UTF-8 character; the StopMatcher cuts at the
    earliest stop string; the OutputRouter splits what is left into content,
    reasoning and tool calls. Every character reaches the output once.
    """

    def __init__(self, detokenizer, stops: Sequence[str], router: Optional["OutputRouter"] = None):
        self._detok = detokenizer
        self._stops = StopMatcher(list(stops))
        self.router = router or OutputRouter()
        self._decoded = 0  # characters out of the detokenizer so far
        self._visible = 0  # characters the stop matcher let through
        self._starts: List[int] = []  # where each token's text begins

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def add_token(self, token: int) -> List[Delta]:
        if self._stops.stopped:
            return []
        self._starts.append(self._decoded)
        self._detok.add_token(token)
        return self._route(self._detok.last_segment)

    def finalize(self) -> List[Delta]:
        """Flush the detokenizer, the stop matcher's tail and the router."""
        out: List[Delta] = []
        if not self._stops.stopped:
            self._detok.finalize()
            out = self._route(self._detok.last_segment, final=True)
        return out + self.router.finalize()

    def kept_tokens(self) -> int:
        """How many tokens' text begins before the cut: the rest made only stop text."""
        return bisect.bisect_left(self._starts, self._visible) if self._stops.stopped else len(self._starts)

    def _route(self, segment: str, final: bool = False) -> List[Delta]:
        self._decoded += len(segment)
        text = self._stops.feed(segment)
        if final:
            text += self._stops.finalize()
        self._visible += len(text)
        return self.router.feed(text)
