#!/usr/bin/env python3
"""`make bench`: our server against raw mlx-lm, same model, same prompts, same run.

Raw mlx-lm runs first in a child process (so the two never share the 2 cores),
then the real server is started and driven over gRPC. Prints a table of
ratios and writes the figures as JSON (bench-results.json, or --out).

  (a) single-stream decode tok/s        vs mlx_lm.stream_generate
  (b) aggregate tok/s at 1/4/8 streams  vs mlx_lm.batch_generate
  (c) cold time to first token          vs raw prefill + first token
  (d) warm TTFT (shared ~400-token prefix) vs cold
  (e) Health p50/p99 while 8 streams decode
  (f) time from cancel to the slot being free
  (g) longest pause of a running stream while a long prompt is prefilled
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO]

from common.openblas import maybe_reexec_with_openblas  # noqa: E402

DECODE_TOKENS = 64
QUESTIONS = [
    "Write a long essay about the history of France.",
    "Explain how a steam engine works, in detail.",
    "Describe the water cycle step by step.",
    "Tell a long story about a dragon and a knight.",
    "Explain the rules of chess to a beginner.",
    "Describe a walk through a busy market.",
    "Write a detailed recipe for bread.",
    "Explain why the sky is blue, at length.",
]
PREFIX = ("You are a meticulous assistant. Background notes follow. " +
          " ".join(f"Note {i}: the archive entry {i} records a shipment of {i * 7} crates "
                   f"of tea to port number {i % 13}." for i in range(1, 26)))


def chat_tokens(tokenizer, question, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True)


# ---- raw mlx-lm (child process) -------------------------------------------------


def raw_main() -> None:
    from mlx_lm import batch_generate, load, stream_generate

    from gguf_loader import gguf_to_mlx_dir
    from model_loader import _cast, _choose_dtype, embedded_default

    model, tok = load(str(gguf_to_mlx_dir(embedded_default())))
    dtype = _choose_dtype("auto", model)
    if dtype:
        _cast(model, dtype)
    out = {"dtype": dtype or "native"}

    def stream(prompt, n):
        times, toks = [], 0
        start = time.perf_counter()
        for r in stream_generate(model, tok, prompt, max_tokens=n):
            times.append(time.perf_counter())
            toks = r.generation_tokens
        return start, times, toks

    stream(chat_tokens(tok, "warm up"), 8)
    start, times, n = stream(chat_tokens(tok, QUESTIONS[0]), DECODE_TOKENS)
    out["single_decode_tps"] = (len(times) - 1) / (times[-1] - times[0])
    out["single_tokens"] = n
    ttfts = []
    for i in range(3):
        s, t, _ = stream(chat_tokens(tok, f"Question {i}: " + QUESTIONS[i + 1]), 1)
        ttfts.append(t[0] - s)
    out["cold_ttft_ms"] = statistics.median(ttfts) * 1000
    for n_streams in (1, 4, 8):
        prompts = [chat_tokens(tok, q) for q in QUESTIONS[:n_streams]]
        start = time.perf_counter()
        resp = batch_generate(model, tok, prompts, max_tokens=DECODE_TOKENS)
        wall = time.perf_counter() - start
        total = resp.stats.generation_tokens
        out[f"batch{n_streams}_tps"] = total / wall
        out[f"batch{n_streams}_decode_tps"] = resp.stats.generation_tps
    print(json.dumps(out))


# ---- our server -------------------------------------------------------------------


def ours(log_path: str) -> dict:
    from common.launcher import Backend, backend_pb2

    out = {}
    with Backend(log_path=log_path) as b:
        assert b.load("").success
        stub = b.stub

        def opts(q, n=DECODE_TOKENS, system=None):
            msgs = ([backend_pb2.Message(role="system", content=system)] if system else []) + \
                   [backend_pb2.Message(role="user", content=q)]
            return backend_pb2.PredictOptions(Messages=msgs, UseTokenizerTemplate=True, Tokens=n)

        def stream(o):
            start = time.perf_counter()
            times, last, first = [], None, None
            for last in stub.PredictStream(o, timeout=600):
                times.append(time.perf_counter())
                first = first or last
            return start, times, last, first

        stream(opts("warm up", 8))
        start, times, last, first = stream(opts(QUESTIONS[0]))
        out["single_tokens"] = last.tokens
        # A chunk may carry several tokens: rate over the tokens after the first chunk.
        out["single_decode_tps"] = (last.tokens - first.tokens) / (times[-1] - times[0])

        ttfts = []
        for i in range(3):
            s, t, *_ = stream(opts(f"Question {i}: " + QUESTIONS[i + 1], 1))
            ttfts.append(t[0] - s)
        out["cold_ttft_ms"] = statistics.median(ttfts) * 1000

        def concurrent(n_streams, tag, poll_health=False):
            results = [None] * n_streams
            start = time.perf_counter()

            def run(i):
                results[i] = stream(opts(QUESTIONS[i] + tag))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(n_streams)]
            for t in threads:
                t.start()
            health = []
            while poll_health and any(t.is_alive() for t in threads):
                h0 = time.perf_counter()
                stub.Health(backend_pb2.HealthMessage(), timeout=5)
                health.append((time.perf_counter() - h0) * 1000)
                time.sleep(0.02)
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            return results, wall, sorted(health)

        for n_streams in (1, 4, 8):
            results, wall, _ = concurrent(n_streams, " " * n_streams)
            out[f"batch{n_streams}_tps"] = sum(r[2].tokens for r in results) / wall
            out[f"batch{n_streams}_slowest_first_token_s"] = max(r[1][0] - r[0] for r in results)

        # Health polled from another client while 8 streams decode (a run of its own,
        # so the polling does not weigh on the throughput figures above).
        _, _, health = concurrent(8, " (health)", poll_health=True)
        out["health_p50_ms"] = health[len(health) // 2]
        out["health_p99_ms"] = health[min(len(health) - 1, int(len(health) * 0.99))]
        out["health_samples"] = len(health)

        cold_s, cold_t, *_ = stream(opts("Summarise note 3.", 1, system=PREFIX))
        warm_s, warm_t, last, _ = stream(opts("Summarise note 17.", 1, system=PREFIX))
        out["prefix_prompt_tokens"] = last.prompt_tokens
        out["prefix_cold_ttft_ms"] = (cold_t[0] - cold_s) * 1000
        out["prefix_warm_ttft_ms"] = (warm_t[0] - warm_s) * 1000

        # (g) a long prompt arrives while a stream decodes: the stream's longest
        # pause should be about one prefill chunk plus one decode step.
        long_prompt = "Summarise these notes. " + PREFIX + " " + PREFIX.replace("Note", "Entry")
        gaps, seen = [], threading.Event()

        def victim():
            last = None
            for i, _ in enumerate(stub.PredictStream(opts(QUESTIONS[5] + " (stall)", 80), timeout=600)):
                now = time.perf_counter()
                if last is not None and seen.is_set():
                    gaps.append(now - last)
                last = now
                if i == 4:
                    seen.set()

        v = threading.Thread(target=victim)
        v.start()
        seen.wait(120)
        long_start, long_times, long_last, _ = stream(opts(long_prompt, 1))
        v.join()
        out["stall_prompt_tokens"] = long_last.prompt_tokens
        out["stall_max_gap_ms"] = max(gaps) * 1000 if gaps else 0.0
        # While the victim decodes, each engine step is one decode step plus one
        # 128-token prefill chunk: the long prompt's TTFT over its chunk count.
        chunks = -(-long_last.prompt_tokens // 128)
        out["prefill_chunk_ms"] = (long_times[0] - long_start) * 1000 / chunks

        frees = []
        for i in range(3):
            call = stub.PredictStream(opts(QUESTIONS[i] + " (again)", 200), timeout=600)
            for j, _ in enumerate(call):
                if j == 2:
                    break
            t0 = time.perf_counter()
            call.cancel()
            while stub.Status(backend_pb2.HealthMessage(), timeout=5).state != backend_pb2.StatusResponse.READY:
                time.sleep(0.002)
            frees.append((time.perf_counter() - t0) * 1000)
        out["cancel_to_free_ms"] = statistics.median(frees)
        m = stub.GetMetrics(backend_pb2.MetricsRequest(), timeout=5)
        out["decode_step_ms"] = 1000.0 / out["single_decode_tps"] if out["single_decode_tps"] else 0
        out["metrics_tokens_generated"] = m.tokens_generated
    return out


def table(raw: dict, us: dict) -> str:
    rows = [
        ("(a) single-stream decode tok/s", us["single_decode_tps"], raw["single_decode_tps"],
         us["single_decode_tps"] / raw["single_decode_tps"], ">= 0.97x raw"),
    ]
    for n in (1, 4, 8):
        rows.append((f"(b) aggregate tok/s, {n} streams", us[f"batch{n}_tps"], raw[f"batch{n}_tps"],
                     us[f"batch{n}_tps"] / raw[f"batch{n}_tps"], ">= 0.95x raw at 8" if n == 8 else ""))
    rows += [
        ("(b) 8 streams vs our single stream", us["batch8_tps"], us["single_decode_tps"],
         us["batch8_tps"] / us["single_decode_tps"], ">= 4x"),
        ("(b) slowest first token of 8 (s)", us["batch8_slowest_first_token_s"], None, None, "<= 2 s"),
        ("(c) cold TTFT ms", us["cold_ttft_ms"], raw["cold_ttft_ms"],
         us["cold_ttft_ms"] - raw["cold_ttft_ms"], "<= raw + 15 ms (diff)"),
        ("(d) warm TTFT ms (shared prefix)", us["prefix_warm_ttft_ms"], us["prefix_cold_ttft_ms"],
         us["prefix_warm_ttft_ms"] / us["prefix_cold_ttft_ms"], "<= 0.1x cold"),
        ("(e) Health p50 ms, 8 streams", us["health_p50_ms"], None, None, ""),
        ("(e) Health p99 ms, 8 streams", us["health_p99_ms"], None, None, "<= 20 ms"),
        ("(f) cancel -> slot free ms", us["cancel_to_free_ms"], us["decode_step_ms"],
         us["cancel_to_free_ms"] / us["decode_step_ms"], "<= 1 decode step"),
        ("(g) longest stream pause, long prefill ms", us["stall_max_gap_ms"], us["prefill_chunk_ms"],
         us["stall_max_gap_ms"] / us["prefill_chunk_ms"], "~1 (chunk + step)"),
    ]
    lines = [f"{'measure':40} {'ours':>10} {'reference':>10} {'ratio':>8}  target",
             "-" * 88]
    for name, a, b, r, target in rows:
        fb = f"{b:10.1f}" if b is not None else f"{'':>10}"
        fr = f"{r:8.2f}" if r is not None else f"{'':>8}"
        lines.append(f"{name:40} {a:10.1f} {fb} {fr}  {target}")
    return "\n".join(lines)


def main() -> None:
    maybe_reexec_with_openblas()
    parser = argparse.ArgumentParser()
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(REPO, "bench-results.json"))
    parser.add_argument("--log", default=os.path.join(REPO, "bench-server.log"))
    args = parser.parse_args()
    if args.raw:
        raw_main()
        return
    print("measuring raw mlx-lm ...", file=sys.stderr)
    proc = subprocess.run([sys.executable, __file__, "--raw"], capture_output=True, text=True, check=True)
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    print("measuring our server ...", file=sys.stderr)
    us = ours(args.log)
    print(table(raw, us))
    with open(args.out, "w") as f:
        json.dump({"raw_mlx_lm": raw, "ours": us, "decode_tokens": DECODE_TOKENS}, f, indent=2)
    print(f"\nfigures written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
