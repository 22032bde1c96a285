"""Score's oracle, run in a process of its own with the BLAS the server preloads.

Reads {"prompt": [token ids], "candidates": [token id...]} as JSON on stdin and writes
{"plain": [...], "q8": [...]}: each candidate's log-probability after the prompt, from one
forward pass of SmolLM2 in float32 (loaded by the server's own loader), and with the prompt
but its last token prefilled in float and its KV cache quantized to 8 bits by mlx-lm's
`to_quantized` (as mlx-lm's generation quantizes after the prompt) before the last token
runs. In this test process MLX would multiply without OpenBLAS, ~10x slower here over a
400-token prompt, and round differently from the server.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log_softmax_at_end(logits):
    import mlx.core as mx
    import numpy as np

    x = np.array(logits.astype(mx.float32)[0, -1], dtype=np.float64)
    top = x.max()
    return x - (top + np.log(np.exp(x - top).sum()))


def main() -> None:
    sys.path[:0] = [os.path.join(REPO, "backend"), REPO]
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from loaders import model_loader

    job = json.load(sys.stdin)
    p, ids = job["prompt"], job["candidates"]
    spec = model_loader.LoadSpec(model=model_loader.embedded_default(), dtype="float32")
    model = model_loader.load(spec).model
    plain = log_softmax_at_end(model(mx.array([p])))
    cache = [KVCache() for _ in model.layers]
    model(mx.array([p[:-1]]), cache=cache)
    quantized = [c.to_quantized(group_size=64, bits=8) for c in cache]
    q8 = log_softmax_at_end(model(mx.array([p[-1:]]), cache=quantized))
    json.dump({"plain": [float(plain[t]) for t in ids], "q8": [float(q8[t]) for t in ids]}, sys.stdout)


if __name__ == "__main__":
    main()
