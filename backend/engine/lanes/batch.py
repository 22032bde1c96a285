"""The one interface the scheduler drives generation through (Batch).

A batch holds the running streams of one model: it admits a request (its first token may
come back at once), runs one step for all of them, takes some out (with their KV cache when
it is whole) and keeps finished caches for later prompts. What it can do beyond that is
said by its Capabilities, never asked of the model's kind by the scheduler. The text batch
(text_batch.py), the vision batch (vision_batch.py) and the solo lane (solo.py,
solo_vision.py: one request at a time) implement it; speculation (speculation/spec_batch.py)
and lockstep's journal (lockstep/recording.py) wrap one and implement it too;
engine/batch_factory.py picks one for a model. Engine thread only.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Tuple


@dataclass(frozen=True)
class Capabilities:
    speculate: bool = False  # a lone stream's cache may leave the batch and be rewound (speculate.py)
    shares_prefix: bool = False  # forward work may read and fill its prefix cache (`cache`)
    max_running: int = 0  # requests it runs at once (0: as many as max_sequences); the rest wait in order


class Batch(Protocol):
    capabilities: Capabilities
    prefill_step_size: int
    cache: Any  # the prefix cache (prompt_store), when capabilities.shares_prefix

    def admit(self, prompt: List[int], max_tokens: int, sampling, extra: List[Any], ignore_eos: bool,
              on_error: Callable[[Exception], None], direct: bool = False, boundaries=(),
              **request) -> Tuple[int, int, Optional[Any]]:
        """(uid, prompt tokens served from the cache, its first token when computed here).
        `request` may hold `media` and `request` (the engine Request, for wrappers that keep
        per-request state). Raises on failure, leaving the batch as it was."""

    def step(self) -> Iterable[Any]:
        """One step of every running request: responses (uid, token, logprobs, finish_reason,
        prompt_cache, all_tokens), which a wrapper may produce lazily; a `Failed` response
        fails its request alone."""

    def waiting(self, n: int) -> None:
        """How many requests wait for a place, before each step: a batch running one apart takes
        it back for them; a batch may prefill more of a prompt in a step while some wait."""

    def remove(self, uids: List[int], keep_cache: bool = False) -> Dict[int, Tuple[Any, List[int]]]:
        """Take requests out; with keep_cache, {uid: (KV cache, its tokens)} for those it is whole."""

    def prefill_left(self, uid: int) -> Optional[int]:
        """Prompt tokens a running request has still to prefill in chunks (0 once only its
        last token is left, which goes in with the next decode); None when not known."""

    def forget(self, uid: int) -> str:
        """A request has left: what the batch adds to its last log line ("" when nothing)."""

    def save(self, tokens: Optional[List[int]], cache: Optional[Any]) -> None:
        """Keep a finished request's KV cache for later prompts sharing its prefix."""

    def close(self) -> None:
        ...

    @property
    def cache_bytes(self) -> int:
        ...

    def cache_figures(self) -> dict:
        ...


@dataclass
class Response:
    """One generated token of one request, as a step returns it (a batch generator's shape):
    with its finish, the request's KV cache and the tokens that cache holds."""
    uid: int
    token: int
    logprobs: Any
    finish_reason: Optional[str]
    prompt_cache: Any
    all_tokens: Optional[List[int]]


@dataclass
class Failed:
    """A step's response that fails one request alone (`what` failed, with `error`)."""
    uid: int
    what: str
    error: Exception
    token: int = -1
    finish_reason: Optional[str] = None
