"""Which batch generates for a loaded model: its lane, and the wrappers around it.

The lanes (lanes/) implement one Batch interface (lanes/batch.py); this module is
the one place that picks among them and wraps the choice (speculation/) for the
scheduler's streams (streams.py). Engine thread only.
"""

from engine.lanes.batch import Batch


def open_batch(lm, config, stream, mx, disk_bytes: int, speculate: bool) -> Batch:
    """The batch that generates for `lm` (text, or text with image prefill), wrapped by
    speculation when the model and the batch allow it and `speculate` (not in lockstep)."""
    if lm.serves.media:  # the same batch, with image prefill
        from engine.lanes.vision_batch import VisionBatch as Kind
    else:
        from engine.lanes.text_batch import TextBatch as Kind
    batch = Kind(
        lm, max_sequences=config.max_sequences, prefill_batch_size=config.prefill_batch_size,
        # Measured on a 2-core CPU: 66-87 tok/s prefill whatever the chunk from 64 to
        # 512 tokens, so a small chunk costs little and bounds the stall of running streams.
        prefill_step_size=config.prefill_step_size or (128 if mx.default_device() == mx.cpu else 512),
        prompt_cache_bytes=config.prompt_cache_bytes, prompt_cache_entries=config.prompt_cache_entries,
        prompt_cache_disk_bytes=disk_bytes, stream=stream)
    if speculate and batch.capabilities.speculate:
        from engine.speculation.spec_batch import SpeculatingBatch

        return SpeculatingBatch(batch, lm, stream)
    return batch
