"""The engine: one thread owns the model and every MLX call.

The scheduler sits at this level: `core` the engine itself (inbox, one loop,
delivery, swap), `requests` what enters and leaves it (requests, events,
commands, the failure -> error map), `work` the one interface it drives every
kind of work through, `streams` a stream's way from arrival to its last event,
`admission` and `kv_budget` the queue and KV budget, `forward_queue` forward
jobs as the other kind of work, `batch_factory` which lane serves a model and
its wrappers, `lane_choice` and `lane_probe` how that lane is chosen at load
(the cache classes, then short requests through each lane), `hooks` what a variant (lockstep)
changes, `config` and `health` its settings and what Health reads, `device_setup`
the device calls mlx-lm's server makes (the wired limit on Metal), `faults`
test-only fault injection. Beneath it, by concern, each with its own map:
  lanes/        the batches that generate (text, vision) and the solo lane behind one
                Batch interface, per-request sampling, grammar and logprobs
  prefix/       the prefix cache: memory, disk tier, boundary snapshots
  kv/           forms of a live KV cache (quantized rows, whether it can rewind)
  speculation/  a lone stream's speculative decoding, wrapping a lane
  forward/      embeddings, scores and pairs, the scheduler's other kind of work
  lockstep/     one model served across ranks, wrapping the scheduler
Imports only run downward: nothing here imports the servicer (backend.py) or
request preparation (prepare/); models come from `loaders`. Inside, the
scheduler imports the sub-packages; lockstep imports the scheduler; speculation
imports lanes; lanes and forward import prefix; prefix imports kv; kv imports
none of them (tests/unit/test_layers.py checks it).

The names the servicer and the preparation thread use are re-exported here.
"""

from engine.config import EngineConfig
from engine.core import Engine
from engine.requests import EngineError, Event, Request, Stop
from loaders import kv_cache


def _install_kv_forms(model, spec) -> None:
    from engine.kv import kv_rows  # on first use, as before: mlx-vlm's cache module is not a start-up cost

    kv_rows.install(model, spec)


# Loaders never import the engine: the engine hands them its KV cache forms, before any load.
kv_cache.provide(_install_kv_forms)

__all__ = ["Engine", "EngineConfig", "EngineError", "Event", "Request", "Stop"]
