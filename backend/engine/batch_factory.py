"""Which batch generates for a loaded model: its lane, and the wrappers around it.

The lanes (lanes/) implement one Batch interface (lanes/batch.py); this module is
the one place that picks among them, by the lane chosen at load (lm.lane: LoadModel builds
the served model with lane_choice.py's decision, from the model's caches and a check; the
check's runs each get a copy of the model with the lane it tests), and wraps the choice
(speculation/) for the scheduler's streams (streams.py). Engine thread only (and
the loading thread, for the check at load).
"""

from dataclasses import dataclass

from engine.lanes.batch import Batch

# On the CPU a step prefills at most one chunk, all new requests together: ~1 s here at
# 100-170 prefill tok/s, the stall the docs promise running streams. Two chunks (256) were
# tried first: on the peers' trace every step then carried ~2 s of prefill (6 s on a loaded
# machine) and running streams fell to a token every few seconds (docs/benchmarks.md).
CPU_STEP_CHUNKS = 1
# While requests wait for a place, the prompt being prefilled takes two chunks a step on the CPU:
# every step also decodes all running streams, which here costs about what a chunk does, and a
# backlog drains in fewer steps. Measured in-process on the peers' trace, 32 at once, two runs
# each: 56 -> 35 steps to place them all, last first token 64.5/73.3 s -> 62.3/61.2 s, TPOT p99
# +12%. The two chunks are still fed as two passes of one chunk: a prompt's numbers are the same.
# Not on a GPU (not measured there), nor when prefill_step_tokens is set (a bound the user chose).
CPU_BACKLOG_CHUNKS = 2


@dataclass(frozen=True)
class PrefillSizes:
    step_size: int  # prompt tokens of one request per chunk (the batch generator's prefill_step_size)
    step_tokens: int  # prompt tokens of all new requests in one step while streams decode (admission keeps to it)
    idle_tokens: int  # the same while none decodes: the library's own bound, prefill_batch_size chunks
    backlog_size: int  # prompt tokens of one request in one step while others wait for a place


def prefill_sizes(config, mx) -> PrefillSizes:
    """The prefill chunk and the per-step prefill budget for this device.

    Measured on a 2-core CPU: 66-87 tok/s prefill whatever the chunk from 64 to 512 tokens,
    so a small chunk costs little and bounds the stall of running streams. On a GPU the
    library's own bound is kept (a step prefills at most prefill_batch_size chunks: mlx-lm's
    BatchGenerator), with a chunk of 512 rather than its 2048."""
    cpu = mx.default_device() == mx.cpu
    step = config.prefill_step_size or (128 if cpu else 512)
    budget = config.prefill_step_tokens or step * (CPU_STEP_CHUNKS if cpu else config.prefill_batch_size)
    backlog = step * (CPU_BACKLOG_CHUNKS if cpu and not config.prefill_step_tokens else 1)
    return PrefillSizes(step, budget, max(budget, step * config.prefill_batch_size), backlog)


def open_batch(lm, config, stream, mx, disk_bytes: int, speculate: bool) -> Batch:
    """The batch that generates for `lm` (text, or text with image prefill; in the batch or
    solo), wrapped by speculation when the model and the batch allow it and `speculate`
    (not in lockstep)."""
    lane = lm.lane
    if lane.solo and lm.serves.media:
        from engine.lanes.solo_vision import SoloVisionBatch as Kind
    elif lane.solo:
        from engine.lanes.solo import SoloBatch as Kind
    elif lm.serves.media:  # the same batch, with image prefill
        from engine.lanes.vision_batch import VisionBatch as Kind
    else:
        from engine.lanes.text_batch import TextBatch as Kind
    sizes = prefill_sizes(config, mx)
    batch = Kind(
        lm, max_sequences=config.max_sequences,
        # A prompt prefilled alone is one no padding reaches (a recurrent state would fold it in).
        prefill_batch_size=1 if lane.prefill_alone else config.prefill_batch_size,
        prefill_step_size=sizes.step_size, backlog_step_size=sizes.backlog_size,
        prompt_cache_bytes=config.prompt_cache_bytes, prompt_cache_entries=config.prompt_cache_entries,
        prompt_cache_disk_bytes=disk_bytes, stream=stream)
    if speculate and batch.capabilities.speculate:
        from engine.speculation.spec_batch import SpeculatingBatch

        return SpeculatingBatch(batch, lm, stream)
    return batch
