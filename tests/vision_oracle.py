"""mlx-vlm's own greedy generation with an image, run in a process of its own: the oracle.

Reads {"model": dir, "question": text, "seeds": [image seed...], "max_tokens": n}
on stdin; writes per seed the token ids of mlx-vlm's `stream_generate`
(temperature 0, at most max_tokens) up to the first step whose top-2 margin is
under 1e-3.
"""

import base64
import io
import json
import os
import subprocess
import sys

MARGIN = 1e-3


def main() -> None:
    import mlx.core as mx
    from PIL import Image
    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vision_fixture import image_b64

    job = json.load(sys.stdin)
    model, processor = load(job["model"])
    answers = []
    for seed in job["seeds"]:
        image = Image.open(io.BytesIO(base64.b64decode(image_b64(seed)))).convert("RGB")
        prompt = apply_chat_template(processor, model.config, job["question"], num_images=1)
        tokens = []
        for r in stream_generate(model, processor, prompt, image=[image], max_tokens=job["max_tokens"],
                                 temperature=0.0):
            top2 = sorted(mx.topk(r.logprobs.reshape(-1), 2).tolist())
            if top2[1] - top2[0] < MARGIN:
                break
            tokens.append(r.token)
        answers.append(tokens[:job["max_tokens"]])  # it may yield one past max_tokens
    json.dump(answers, sys.stdout)


def run(model: str, question: str, seeds, max_tokens: int) -> list:
    job = json.dumps({"model": model, "question": question, "seeds": list(seeds), "max_tokens": max_tokens})
    from family_oracle import server_blas_env

    out = subprocess.run([sys.executable, __file__], input=job, capture_output=True, text=True, timeout=600,
                         env=server_blas_env())
    if out.returncode:
        raise RuntimeError(f"the oracle failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


if __name__ == "__main__":
    main()
