"""The engine and its kinds of work.

`core` is the engine itself: one thread owns the model and every MLX call.
Beside it, the work it runs: text and vision generation (`text_batch`,
`vision_batch`), forward-only work (`forward`, `pair_forward`, `row_batch`),
speculation (`speculate`, `ngram`, `spec_config`), per-request sampling
(`sampling`, `logprobs`, `grammar`) and serving one model across ranks
(`lockstep/`). Imports only run downward: nothing here imports the servicer
(backend.py) or request preparation (prepare.py); models come from `loaders`.

The names the servicer and the preparation thread use are re-exported here.
"""

from engine.core import Engine, EngineConfig, EngineError, Event, Request, Stop

__all__ = ["Engine", "EngineConfig", "EngineError", "Event", "Request", "Stop"]
