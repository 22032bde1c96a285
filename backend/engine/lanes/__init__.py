"""Lanes: the batches that generate for a loaded model, behind one interface.

`batch` the Batch interface the scheduler drives and its Capabilities;
`text_batch` mlx-lm's BatchGenerator with the prefix cache; `vision_batch` the
same, prefilled with mlx-vlm's embeddings; `solo` one request at a time through
mlx-lm's own generation step, `solo_vision` through mlx-vlm's; per request:
`sampling` (samplers, logits processors), `grammar` (llguidance), `logprobs`.
Which lane serves a model is picked outside, in engine/batch_factory.py, by the
lane engine/lane_choice.py chose at load. Lanes import the prefix
cache (prefix/) and the KV forms (kv/), never speculation, forward work,
lockstep or the scheduler.
"""
