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
from loaders import kv_cache


def _install_kv_forms(model, spec) -> None:
    from engine import kv_rows  # on first use, as before: mlx-vlm's cache module is not a start-up cost

    kv_rows.install(model, spec)


# Loaders never import the engine: the engine hands them its KV cache forms, before any load.
kv_cache.provide(_install_kv_forms)

__all__ = ["Engine", "EngineConfig", "EngineError", "Event", "Request", "Stop"]
