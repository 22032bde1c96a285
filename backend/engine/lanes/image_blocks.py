"""A prefill that attends both ways inside each image, as Gemma 3's reference does.

Gemma 3 is published with a prefill mask that is causal over the text and bidirectional inside
each image: transformers' Gemma3 marks image tokens with token_type_ids, each maximal run of
them is one block, a query in a block may attend every key of that block (its sliding layers
keep their window), and decode steps are causal. mlx-vlm 0.7.10 builds a 4-D mask in its
embedding step, but its generation hands it to a language model that ignores it: its prefill is
plainly causal, and on prompts where the image's own tokens matter its answer differs from the
reference's (docs/model-families.md, "Gemma 3 vision"). Here a prefill chunk that holds image
tokens runs the language model's own layers with the reference's masks; a chunk never ends
inside an image, since a query of the block must see the whole block. Text-only chunks and the
decode steps are untouched (causal, as the reference's). Engine thread (the masks: any thread).
"""

from typing import Dict, Optional, Sequence

import numpy as np


def blocks(ids: Sequence[int], image_ids) -> np.ndarray:
    """Per prompt position: k for a token of the k-th run of image tokens, -1 for text."""
    image = np.isin(np.asarray(ids), list(image_ids))
    starts = image & ~np.concatenate([[False], image[:-1]])
    return np.where(image, np.cumsum(starts) - 1, -1)


def chunk_end(block: np.ndarray, start: int, step: int) -> int:
    """Where a prefill chunk from `start` of about `step` tokens ends: never inside an image."""
    end = min(start + step, len(block))
    while 0 < end < len(block) and block[end] >= 0 and block[end] == block[end - 1]:
        end += 1
    return end


def masks(block: np.ndarray, start: int, end: int, window: Optional[int]) -> Dict[str, np.ndarray]:
    """The reference's masks for the queries start..end-1 over the keys 0..end-1 (True: may
    attend): "global" for full-attention layers, "sliding" for the windowed ones."""
    q = np.arange(start, end)[:, None]
    k = np.arange(end)[None, :]
    both = (block[q] == block[k]) & (block[q] >= 0)
    full = (k <= q) | both
    out = {"global": full}
    if window:
        out["sliding"] = full & (k > q - window)
    return out


def has_images(block: np.ndarray, start: int, end: int) -> bool:
    return bool((block[start:end] >= 0).any())


def prefill(lm, inputs_embeds, cache, block: np.ndarray, start: int, end: int):
    """Gemma 3's language model over prompt positions start..end-1 (their embeddings), with the
    reference's masks, as its own loop runs its layers (the input scaling, then each layer with its
    global or sliding mask, the final norm, the head). Its logits."""
    import mlx.core as mx

    model, config = lm.model, lm.config
    h = inputs_embeds
    if model.scale_inputs_embeds:
        h = h * mx.array(config.hidden_size ** 0.5, mx.bfloat16).astype(h.dtype)
    pattern = model.sliding_window_pattern
    made = {name: mx.array(m)[None, None] for name, m in masks(block, start, end, model.window_size).items()}
    for i, (layer, c) in enumerate(zip(model.layers, cache)):
        is_global = i % pattern == pattern - 1
        h = layer(h, made["global"] if is_global or pattern == 1 else made["sliding"], c)
    return lm.lm_head(model.norm(h))
