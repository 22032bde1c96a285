"""Gemma 3's greedy answer about an image as its published reference computes it: the oracle of
the server's Gemma 3 prefill, run in a process of its own.

The reference (transformers' Gemma3, token_type_ids): in the prefill, a query may attend every
earlier key, and every key of its own image (each maximal run of image tokens is one image);
a sliding layer also keeps only the keys within its window; decode steps are causal. Written
here as a loop over the pairs, apart from the server's code (engine/lanes/image_blocks.py): the
whole prompt in one pass through mlx-vlm's own Gemma 3 layers, then one token a step through
the language model as mlx-vlm runs it. Also, for the evidence, mlx-vlm's own greedy answer.

Reads {"model", "question", "image": [seed, width, height], "max_tokens"} as JSON on stdin;
writes {"reference": tokens, "library": tokens}.
"""

import base64
import io
import json
import os
import sys


def reference_mask(ids, image_id, window=None):
    """(N, N) bools, True where query i may attend key j, pair by pair."""
    n = len(ids)
    image_of, run = [-1] * n, -1
    for i, t in enumerate(ids):
        if t == image_id:
            if i == 0 or ids[i - 1] != image_id:
                run += 1
            image_of[i] = run
    out = [[False] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            ok = j <= i or (image_of[i] >= 0 and image_of[i] == image_of[j])
            if window is not None and j <= i - window:
                ok = False
            out[i][j] = ok
    return out


def greedy(model, processor, prompt: str, image, max_tokens: int):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_vlm.utils import prepare_inputs

    inputs = prepare_inputs(processor, images=[image], prompts=prompt)
    ids = inputs["input_ids"]
    row = np.array(ids).reshape(-1).tolist()
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    embeds = model.get_input_embeddings(ids, inputs["pixel_values"], mask=inputs["attention_mask"], **extra)
    lm = model.language_model
    body = lm.model
    h = embeds.inputs_embeds * mx.array(body.config.hidden_size ** 0.5, mx.bfloat16).astype(embeds.inputs_embeds.dtype)
    image_id = model.config.image_token_index
    full = mx.array(reference_mask(row, image_id))[None, None]
    sliding = mx.array(reference_mask(row, image_id, body.window_size))[None, None]
    cache = make_prompt_cache(lm)
    pattern = body.sliding_window_pattern
    for i, (layer, c) in enumerate(zip(body.layers, cache)):
        h = layer(h, full if i % pattern == pattern - 1 else sliding, c)
    logits = lm.lm_head(body.norm(h))[:, -1]
    tokens = []
    for _ in range(max_tokens):
        token = int(mx.argmax(logits, axis=-1).item())
        tokens.append(token)
        logits = getattr(lm(mx.array([[token]]), cache=cache), "logits")[:, -1]
    return tokens


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from PIL import Image
    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    from vision_fixture import image_b64

    job = json.load(sys.stdin)
    model, processor = load(job["model"])
    seed, width, height = job["image"]
    image = Image.open(io.BytesIO(base64.b64decode(image_b64(seed, (width, height))))).convert("RGB")
    prompt = apply_chat_template(processor, model.config, job["question"], num_images=1)
    ours = greedy(model, processor, prompt, image, job["max_tokens"])
    library = [r.token for r in stream_generate(model, processor, prompt, image=[image], max_tokens=job["max_tokens"],
                                                temperature=0.0)][:job["max_tokens"]]
    print(json.dumps({"reference": ours, "library": library}))


if __name__ == "__main__":
    main()
