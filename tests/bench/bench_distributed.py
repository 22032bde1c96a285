"""Bench: one model on 1 and on 2 ranks (ring backend, loopback), ours vs raw mlx-lm.

For each group size it measures, in the same run and on the same model:
- ours: greedy decode tok/s of one stream through the real server (the Reply's
  own generation timing), and the memory each rank reports in Status;
- raw: mlx-lm alone, the model split with the same `shard()`, decoded with
  `stream_generate` in a script started as the same ranks;
- the communication inside one decode step: the raw all_sum of one hidden
  vector, timed on its own, times the all_sums one step makes (two per layer).

    .venv/bin/python tests/bench/bench_distributed.py [--model tiny|qwen|PATH] [--tokens N]

On one 2-core machine two ranks are slower than one (they share the cores
and add a round trip per layer); the figure that matters is ours vs raw at
the same group size.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO / "backend"), str(REPO), str(HERE.parent)]

from common.launcher import Backend, backend_pb2  # noqa: E402
from dist_support import RankGroup, hostfile, tiny_llama_dir  # noqa: E402

PROMPT = "The history of the printing press begins"

RAW = r'''
import json, os, sys, time
sys.path[:0] = [sys.argv[4], os.path.dirname(sys.argv[4])]
from common.openblas import maybe_reexec_with_openblas
maybe_reexec_with_openblas()
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
path, tokens, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
group = mx.distributed.init(backend="ring") if os.environ.get("MLX_HOSTFILE") else None
model, tok = load(path, lazy=True)
model.set_dtype(mx.float32)
if group is not None and group.size() > 1:
    model.shard(group)
mx.eval(model.parameters())
size = group.size() if group is not None else 1
comm_us = 0.0
if size > 1:
    x = mx.zeros((1, 1, model.args.hidden_size), dtype=mx.float32)
    for _ in range(20):
        mx.eval(mx.distributed.all_sum(x, group=group))
    start = time.perf_counter()
    for _ in range(200):
        mx.eval(mx.distributed.all_sum(x, group=group))
    comm_us = (time.perf_counter() - start) / 200 * 1e6
sampler = make_sampler(0.0)
for _ in stream_generate(model, tok, prompt, max_tokens=4, sampler=sampler):
    pass
last = None
for last in stream_generate(model, tok, prompt, max_tokens=tokens, sampler=sampler):
    pass
print("RESULT " + json.dumps({"rank": group.rank() if group is not None else 0, "tps": last.generation_tps,
      "tokens": last.generation_tokens, "comm_us": comm_us, "active": mx.get_active_memory(),
      "layers": len(model.layers)}), flush=True)
'''


def model_path(choice: str, workdir: Path) -> str:
    if choice == "tiny":
        return tiny_llama_dir(workdir / "tiny")
    if choice == "qwen":
        from loaders.gguf_loader import gguf_to_mlx_dir
        from models import qwen_coder_gguf

        return str(gguf_to_mlx_dir(qwen_coder_gguf()))
    return choice


def raw(path: str, ranks: int, tokens: int, workdir: Path) -> dict:
    script = workdir / "raw.py"
    script.write_text(RAW)
    args = [sys.executable, str(script), path, str(tokens), PROMPT, str(REPO / "backend")]
    env = dict(os.environ)
    if ranks > 1:
        env["MLX_HOSTFILE"] = hostfile(workdir / "raw-hosts.json", ["127.0.0.1"] * ranks)
    procs = [subprocess.Popen(args, env=dict(env, MLX_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(ranks)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=3600)
        results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    results.sort(key=lambda r: r["rank"])
    return {"tps": results[0]["tps"], "comm_us": results[0]["comm_us"], "layers": results[0]["layers"],
            "memory": [r["active"] for r in results]}


def ours(path: str, ranks: int, tokens: int, workdir: Path) -> dict:
    backend = (Backend(log_path=str(workdir / "ours-1.log")) if ranks == 1
               else RankGroup(ranks, workdir, log_name=f"ours-{ranks}"))
    try:
        backend.wait_healthy(600)
        result = backend.load(path)
        assert result.success, result.message
        opts = backend_pb2.PredictOptions(Prompt=PROMPT, Temperature=0.0, IgnoreEOS=True)
        opts.Tokens = 4
        list(backend.stub.PredictStream(opts, timeout=3600))  # warm-up
        opts.Tokens = tokens
        last = None
        for last in backend.stub.PredictStream(opts, timeout=3600):
            pass
        # The first token is timed as prompt processing: the decode rate counts the others.
        tps = (last.tokens - 1) * 1000.0 / last.timing_token_generation
        time.sleep(1.5)  # followers' memory arrives with their heartbeat
        mem = backend.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown
        memory = [mem["active"]] + [mem.get(f"rank{r}_active", 0) for r in range(1, ranks)]
        return {"tps": tps, "memory": memory}
    finally:
        backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (random weights, built here), qwen, or a path")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = model_path(args.model, workdir)
        rows = []
        for ranks in (1, args.ranks):
            r = raw(path, ranks, args.tokens, workdir)
            o = ours(path, ranks, args.tokens, workdir)
            rows.append((ranks, o, r))
    print(f"model {args.model}, greedy decode of {args.tokens} tokens, one stream")
    print("| ranks | ours tok/s | raw mlx-lm tok/s | ours / raw | comm per step (raw all_sum x 2/layer) "
          "| memory per rank MB (ours / raw) |")
    print("|---|---|---|---|---|---|")
    for ranks, o, r in rows:
        comm = f"{r['comm_us'] * 2 * r['layers'] / 1000:.2f} ms ({r['comm_us']:.0f} us x {2 * r['layers']})" \
            if ranks > 1 else "-"
        mem = ", ".join(f"{a / 1e6:.0f} / {b / 1e6:.0f}" for a, b in zip(o["memory"], r["memory"]))
        print(f"| {ranks} | {o['tps']:.1f} | {r['tps']:.1f} | {o['tps'] / r['tps']:.2f}x | {comm} | {mem} |")


if __name__ == "__main__":
    main()
