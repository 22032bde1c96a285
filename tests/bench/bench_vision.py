#!/usr/bin/env python3
"""`make bench-vision`: image requests through our server vs mlx-vlm itself, in the same run.

  (a) aggregate tok/s of 4 concurrent image requests vs mlx_vlm.batch_generate on
      the same 4 (image, prompt) pairs, greedy, same max tokens
  (b) time to first token of a repeated image + prompt (warm, from the prefix
      cache) vs the first time (cold), ours

Like for like: the raw side runs in this process while the server idles, the
server's side while this process idles; the sides alternate which goes first;
every round uses pictures no earlier round used, so our prefix cache never
helps (a). The model is a random-weight Qwen2-VL of width 384 (vision_fixture) unless --model
names another vision model directory.
"""

import argparse
import base64
import io
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, os.path.join(REPO, "tests")]

QUESTION = "Describe this picture."
SIZE = (448, 336)  # 192 image tokens at the bench model's bound


def pil(b64: str):
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")


def ours_batch(stub, pb, images, n) -> tuple:
    from conftest import run_threads
    from common.launcher import chat

    opts = [chat(QUESTION, Images=[img], Tokens=n, Temperature=0.0) for img in images]
    t0 = time.perf_counter()
    replies = run_threads([lambda o=o: stub.Predict(o, timeout=600) for o in opts])
    wall = time.perf_counter() - t0
    return sum(r.tokens for r in replies), wall


def raw_batch(model, processor, images, n) -> tuple:
    from mlx_vlm import batch_generate

    t0 = time.perf_counter()
    out = batch_generate(model, processor, images=[pil(i) for i in images], prompts=[QUESTION] * len(images),  # it applies the chat template
                         max_tokens=n)
    wall = time.perf_counter() - t0
    return out.stats.generation_tokens, wall


def ttft(stub, image) -> float:
    from common.launcher import chat

    t0 = time.perf_counter()
    for _ in stub.PredictStream(chat(QUESTION, Images=[image], Tokens=4, Temperature=0.0), timeout=600):
        return time.perf_counter() - t0
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="a vision model directory (default: the tiny fixture)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()  # as the server does: both sides on the same BLAS

    from mlx_vlm import load

    from common.launcher import Backend, backend_pb2 as pb
    from vision_fixture import bench_qwen2_vl, image_b64

    model_dir = args.model or bench_qwen2_vl()
    model, processor = load(model_dir)
    backend = Backend(log_path=os.devnull)
    try:
        backend.wait_healthy()
        result = backend.load(model_dir)
        assert result.success, result.message
        stub = backend.stub
        ratios, warm_cold = [], []
        warmup = [image_b64(999 - i, size=SIZE) for i in range(4)]  # first calls pay for set-up
        raw_batch(model, processor, warmup, 4)
        ours_batch(stub, pb, warmup, 4)
        seed = 1000
        for r in range(args.rounds):
            images = [image_b64(seed + i, size=SIZE) for i in range(4)]
            seed += 4
            raw_first = r % 2 == 0
            sides = {}
            for side in (["raw", "ours"] if raw_first else ["ours", "raw"]):
                if side == "raw":
                    sides[side] = raw_batch(model, processor, images, args.tokens)
                else:
                    sides[side] = ours_batch(stub, pb, images, args.tokens)
                time.sleep(0.3)
            ours_rate = sides["ours"][0] / sides["ours"][1]
            raw_rate = sides["raw"][0] / sides["raw"][1]
            ratios.append(ours_rate / raw_rate)
            fresh = image_b64(seed, size=SIZE)
            seed += 1
            cold = ttft(stub, fresh)
            warm = ttft(stub, fresh)
            warm_cold.append(warm / cold)
            print(f"round {r}: ours {ours_rate:.1f} tok/s ({sides['ours'][0]} tokens), "
                  f"mlx-vlm batch_generate {raw_rate:.1f} tok/s ({sides['raw'][0]} tokens); "
                  f"TTFT cold {cold * 1000:.1f} ms, warm {warm * 1000:.1f} ms", flush=True)
        print()
        print("| measure | ratio (median of rounds) | range |")
        print("|---|---|---|")
        print(f"| 4 concurrent image requests, aggregate tok/s, ours / mlx-vlm batch_generate | "
              f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} |")
        print(f"| TTFT of a repeated image + prompt, warm / cold (ours) | "
              f"{statistics.median(warm_cold):.2f}x | {min(warm_cold):.2f}-{max(warm_cold):.2f} |")
    finally:
        backend.stop()


if __name__ == "__main__":
    main()
