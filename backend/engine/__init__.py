"""The engine and its kinds of work.

`core` is the engine itself, a scheduler: one thread owns the model and every
MLX call. `requests` holds what enters and leaves it (requests, events,
commands, the failure -> error map), `streams` a stream's way from arrival to
its last event, `admission` the queue and KV budget, `batch` the one interface
generation runs through, `hooks` what a variant (lockstep) changes, `config`
and `health` its settings and what Health reads, `faults` test-only fault
injection. Beside it, the work it runs: text and vision generation (`text_batch`,
`vision_batch`), forward-only work (`forward`, `score_rows`, `pair_forward`, `row_batch`),
speculation (`spec_batch`, `speculate`, `ngram`, `spec_config`), per-request sampling
(`sampling`, `logprobs`, `grammar`) and serving one model across ranks
(`lockstep/`). Imports only run downward: nothing here imports the servicer
(backend.py) or request preparation (prepare.py); models come from `loaders`.

The names the servicer and the preparation thread use are re-exported here.
"""

from engine.config import EngineConfig
from engine.core import Engine
from engine.requests import EngineError, Event, Request, Stop
from loaders import kv_cache


def _install_kv_forms(model, spec) -> None:
    from engine import kv_rows  # on first use, as before: mlx-vlm's cache module is not a start-up cost

    kv_rows.install(model, spec)


# Loaders never import the engine: the engine hands them its KV cache forms, before any load.
kv_cache.provide(_install_kv_forms)

__all__ = ["Engine", "EngineConfig", "EngineError", "Event", "Request", "Stop"]
