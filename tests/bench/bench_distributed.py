"""Bench: one model on 1, 2 and 3 ranks (ring backend, loopback), tensor and pipeline mode, ours vs raw mlx-lm.

For each row (1 rank; then each group size in each mode), in the same run, on the same model
and prompts:
- ours: the real server, defaults but for the load option `parallel:<mode>`: greedy decode
  tok/s of one stream (the Reply's own generation timing), its time to first streamed chunk
  on a prompt of a few hundred tokens (client side), the aggregate tok/s of three streams at
  once (what batching gives in each mode), and the memory each rank reports in Status;
- raw: mlx-lm alone, the model divided as mlx-lm's `sharded_load` divides it (`model.shard`
  or `model.model.pipeline`, before the weights are read), decoded with `stream_generate`
  in a script started as the same ranks; its time to the first token, and its active memory;
- the communication inside one decode step: the collectives of the exact shapes the mode
  sends, timed on their own; the bytes each rank sends and the messages that follow one
  another, worked out from those shapes and the ring backend's algorithms; and from these the
  time a step spends on links this machine does not have (bandwidths and latencies assumed,
  and labelled so).

    .venv/bin/python tests/bench/bench_distributed.py [--model tiny|qwen|PATH] [--tokens N]
        [--ranks 2,3] [--modes tensor,pipeline] [--json PATH]

On one 2-core machine more ranks are slower than one (they share the cores and wait on each
other); the figures that matter are ours vs raw in the same row, the bytes per step, and
what those bytes cost on a real link.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO / "backend"), str(REPO), str(HERE.parent)]

from common.launcher import Backend, backend_pb2  # noqa: E402
from dist_support import RankGroup, hostfile, tiny_model_dir  # noqa: E402

WARM = "Warm-up: a short note about rivers and the sea"
# Some hundreds of tokens, for the time to first token; it shares no prefix with WARM, so the
# server's prefix cache cannot serve any of it.
SENTENCES = ["the printing press spread across Europe within fifty years of its invention",
             "paper mills grew along rivers where water could turn the wheels",
             "scribes who had copied books by hand found new work as editors and correctors",
             "cheap pamphlets carried arguments about religion and politics to many towns",
             "type founders cast letters in metal alloys that melted at low temperatures"]
LONG = "The history of printing. " + " ".join(f"Part {i}: {SENTENCES[i % 5]}." for i in range(24))
STREAMS = ["Tell a story about a lighthouse keeper", "List the planets and one fact about each",
           "Explain how a bicycle gear works"]

# Links past this machine: assumptions, not measurements (bytes per second, seconds added by
# each message that must arrive before the next can leave).
LINKS = [("1 GbE", 117e6, 100e-6), ("10 GbE", 1.17e9, 50e-6), ("Thunderbolt 5", 5e9, 30e-6)]

RAW = r'''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
sys.path[:0] = [cfg["backend"], os.path.dirname(cfg["backend"])]
from common.openblas import maybe_reexec_with_openblas
maybe_reexec_with_openblas()
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
group = mx.distributed.init(backend="ring") if os.environ.get("MLX_HOSTFILE") else None
size = group.size() if group is not None else 1
rank = group.rank() if group is not None else 0
# As sharded_load: lazy, divided before the weights are read, so a rank reads only its part.
model, tok = load(cfg["path"], lazy=True)
model.set_dtype(mx.float32)
if size > 1 and cfg["mode"] == "tensor":
    model.shard(group)
elif size > 1:
    model.model.pipeline(group)
mx.eval(model.parameters())
if size > 1:
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
active = mx.get_active_memory()
weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
# The layers this rank runs (a pipeline stage's, or every layer's slice): the part that divides.
layers = sum(v.nbytes for _, v in tree_flatten([layer.parameters() for layer in model.layers]))
hidden = model.args.hidden_size
dtype = model.model.embed_tokens(mx.array([[0]])).dtype

def tensor_step(x):
    # Two all_sums per layer (attention out, MLP down), each waiting on the one before.
    for _ in range(2 * len(model.layers)):
        x = mx.distributed.all_sum(x, group=group) * (1.0 / size)
    return x

def pipeline_step(x):
    # The hidden state from the stage before, to the stage after, then to every rank.
    if rank < size - 1:
        x = mx.distributed.recv_like(x, rank + 1, group=group)
    if rank != 0:
        x = mx.distributed.send(x, rank - 1, group=group)
    return mx.distributed.all_gather(x, group=group)[: x.shape[0]]

def sent_so_far():
    # Bytes and data segments out over this process's TCP sockets (the ring's, the only ones
    # here), from Linux's tcp_info (tcpi_data_segs_out at offset 156, tcpi_bytes_sent at 200);
    # None where the kernel does not say.
    import socket, struct
    total = [0, 0]
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # closed meanwhile (the listing's own)
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 208)
                if len(info) < 208:
                    return None
                total[0] += struct.unpack_from("<Q", info, 200)[0]
                total[1] += struct.unpack_from("<I", info, 156)[0]
        finally:
            s.close()
    return total

comm_s, sent = 0.0, None
if size > 1:
    step = tensor_step if cfg["mode"] == "tensor" else pipeline_step
    x = mx.zeros((1, 1, hidden), dtype=dtype)
    for _ in range(10):
        mx.eval(step(x))
    before, start = sent_so_far(), time.perf_counter()
    for _ in range(cfg["comm_steps"]):
        mx.eval(step(x))
    comm_s = (time.perf_counter() - start) / cfg["comm_steps"]
    after = sent_so_far()
    if before is not None and after is not None:
        sent = [(a - b) / cfg["comm_steps"] for a, b in zip(after, before)]
sampler = make_sampler(0.0)
for _ in stream_generate(model, tok, cfg["warm"], max_tokens=4, sampler=sampler):
    pass
start = time.perf_counter()
ttft, last = None, None
for last in stream_generate(model, tok, cfg["prompt"], max_tokens=cfg["tokens"], sampler=sampler):
    ttft = ttft if ttft is not None else time.perf_counter() - start
print("RESULT " + json.dumps({"rank": rank, "tps": last.generation_tps, "ttft_s": ttft,
      "prompt_tokens": last.prompt_tokens, "comm_s": comm_s, "sent": sent, "active": active, "weights": weights,
      "layers": layers, "itemsize": dtype.size}), flush=True)
'''


def model_path(choice: str, workdir: Path) -> str:
    if choice == "tiny":
        return tiny_model_dir(workdir / "tiny")
    if choice == "qwen":
        from loaders.gguf_loader import gguf_to_mlx_dir
        from models import qwen_coder_gguf

        return str(gguf_to_mlx_dir(qwen_coder_gguf()))
    return choice


def shape(path: str) -> Dict[str, int]:
    """Hidden size and layer count from the model's config: what one step's messages carry."""
    config = json.loads((Path(path) / "config.json").read_text())
    text = config.get("text_config", config)
    return {"hidden": text["hidden_size"], "layers": text["num_hidden_layers"]}


def traffic(mode: str, ranks: int, hidden: int, layers: int, itemsize: int, batch: int = 1) -> Dict[str, int]:
    """One decode step's messages, from the shapes mlx-lm sends and MLX's ring algorithms.

    Tensor: two all_sums of [batch, 1, hidden] per layer; the ring's all_sum is a
    reduce-scatter then an all-gather, 2 (ranks - 1) messages of a 1/ranks slice each, every
    one waiting on the one before. Pipeline: the hidden state goes stage to stage (ranks - 1
    sends in a row), then mlx-lm's all_gather of it (ranks - 1 more messages, each of the
    whole state) so every rank has the last stage's output. `in_row` messages follow one
    another; each costs a link's latency plus its bytes over the bandwidth."""
    state = batch * hidden * itemsize
    if mode == "tensor":
        message = math.ceil(batch * hidden / ranks) * itemsize
        in_row = 2 * layers * 2 * (ranks - 1)
        return {"in_row": in_row, "message_bytes": message, "rank_bytes": in_row * message}
    # A middle or first stage sends its state once and its share of the gather (ranks - 1 times).
    return {"in_row": 2 * (ranks - 1), "message_bytes": state, "rank_bytes": state + (ranks - 1) * state}


def link_ms(t: Dict[str, int], bandwidth: float, latency: float) -> float:
    return t["in_row"] * (latency + t["message_bytes"] / bandwidth) * 1000


def raw(path: str, ranks: int, mode: str, tokens: int, workdir: Path) -> dict:
    script = workdir / "raw.py"
    script.write_text(RAW)
    cfg = {"path": path, "tokens": tokens, "mode": mode, "backend": str(REPO / "backend"), "warm": WARM,
           "prompt": LONG, "comm_steps": 50}
    env = dict(os.environ)
    if ranks > 1:
        env["MLX_HOSTFILE"] = hostfile(workdir / "raw-hosts.json", ["127.0.0.1"] * ranks)
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], env=dict(env, MLX_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if len(results) != ranks:
        return {"failed": f"raw mlx-lm: {len(results)} of {ranks} ranks finished (exit codes "
                          f"{[p.returncode for p in procs]})"}
    results.sort(key=lambda r: r["rank"])
    first = results[0]
    return {"tps": first["tps"], "ttft_ms": first["ttft_s"] * 1000, "prompt_tokens": first["prompt_tokens"],
            "comm_ms": max(r["comm_s"] for r in results) * 1000,
            "sent": [r["sent"] for r in results], "itemsize": first["itemsize"],
            "memory": [r["active"] for r in results], "weights": [r["weights"] for r in results],
            "layers": [r["layers"] for r in results]}


def first_chunk(stub, opts) -> dict:
    """One greedy stream: time to its first chunk (client side) and its decode rate."""
    start = time.perf_counter()
    ttft, last = None, None
    for last in stub.PredictStream(opts, timeout=3600):
        if ttft is None and (last.message or last.tokens):
            ttft = time.perf_counter() - start
    ttft = ttft if ttft is not None else time.perf_counter() - start  # nothing streamed before the end
    # The first token is timed as prompt processing: the decode rate counts the others.
    return {"tps": (last.tokens - 1) * 1000.0 / last.timing_token_generation, "ttft_ms": ttft * 1000,
            "prompt_tokens": last.prompt_tokens}


def together(stub, tokens: int) -> float:
    """Aggregate tok/s of three streams sent at once: every token over the wall time."""
    counts: List[int] = []

    def one(prompt: str) -> None:
        opts = backend_pb2.PredictOptions(Prompt=prompt, Tokens=tokens, Temperature=0.0, IgnoreEOS=True)
        last = None
        for last in stub.PredictStream(opts, timeout=3600):
            pass
        counts.append(last.tokens)

    threads = [threading.Thread(target=one, args=(p,)) for p in STREAMS]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def ours(path: str, ranks: int, mode: str, tokens: int, workdir: Path) -> dict:
    """The server with its defaults, but for `parallel` on a group; a refused load is a result."""
    name = f"ours-{ranks}-{mode}"
    backend = (Backend(log_path=str(workdir / f"{name}.log")) if ranks == 1
               else RankGroup(ranks, workdir, log_name=name))
    try:
        backend.wait_healthy(600)
        result = backend.load(path, Options=[f"parallel:{mode}"] if ranks > 1 else [])
        if not result.success:
            return {"refused": result.message}
        time.sleep(1.5)  # followers' memory arrives with their heartbeat
        mem = backend.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown
        memory = [mem["active"]] + [mem.get(f"rank{r}_active", 0) for r in range(1, ranks)]
        served = next((k[len("parallel_"):] for k in mem if k.startswith("parallel_")), "-")
        warm = backend_pb2.PredictOptions(Prompt=WARM, Tokens=4, Temperature=0.0, IgnoreEOS=True)
        list(backend.stub.PredictStream(warm, timeout=3600))
        one = first_chunk(backend.stub, backend_pb2.PredictOptions(Prompt=LONG, Tokens=tokens, Temperature=0.0,
                                                                   IgnoreEOS=True))
        return dict(one, together_tps=together(backend.stub, tokens), memory=memory, served=served)
    finally:
        backend.stop()


def measure(path: str, ranks: int, mode: str, tokens: int, workdir: Path) -> dict:
    print(f"... {ranks} rank(s) {mode}", file=sys.stderr, flush=True)
    try:
        o = ours(path, ranks, mode, tokens, workdir)
    except Exception as e:  # a group that fails mid-run is a row that says so; the others still run
        o = {"refused": f"failed: {e!r}"[:300]}
    # A model the server refuses to divide is not run raw either: mlx-lm would divide it wrongly.
    r = raw(path, ranks, mode, tokens, workdir) if "refused" not in o else {}
    return {"ranks": ranks, "mode": mode, "ours": o, "raw": r}


def fraction(values: List[int], whole: Optional[int]) -> str:
    return ", ".join(f"{v / 1e6:.1f} ({v / whole:.2f})" if whole else f"{v / 1e6:.1f}" for v in values)


def speed_table(rows: List[dict]) -> List[str]:
    lines = ["| ranks | mode | ours tok/s | raw tok/s | ours / raw | ours TTFT ms | raw TTFT ms "
             "| ours 3 streams, tok/s (x one stream) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        o, r = row["ours"], row["raw"]
        if "refused" in o:
            lines.append(f"| {row['ranks']} | {row['mode']} | refused: {o['refused']} | | | | | |")
            continue
        raw_tps = f"{r['tps']:.1f}" if "tps" in r else r.get("failed", "-")
        ratio = f"{o['tps'] / r['tps']:.2f}x" if "tps" in r else "-"
        raw_ttft = f"{r['ttft_ms']:.0f}" if "tps" in r else "-"
        mode = row["mode"] if o["served"] in (row["mode"], "-") else f"{row['mode']} (served {o['served']}!)"
        lines.append(f"| {row['ranks']} | {mode} | {o['tps']:.1f} | {raw_tps} | {ratio} | {o['ttft_ms']:.0f} "
                     f"| {raw_ttft} | {o['together_tps']:.1f} ({o['together_tps'] / o['tps']:.1f}x) |")
    return lines


def counted(sent: Optional[List[Optional[List[float]]]]) -> str:
    """What the kernel saw each rank send per step (tcp_info), rank 0 first."""
    if not sent or any(s is None for s in sent):
        return "-"
    return ", ".join(f"{b:.0f} B / {n:.0f}" for b, n in sent)


def comm_table(rows: List[dict]) -> List[str]:
    head = " | ".join(f"{name} ms (max tok/s)" for name, _, _ in LINKS)
    lines = [f"| ranks | mode | messages in a row | bytes sent per rank | kernel's count: bytes, segments "
             f"per rank | loopback ms, measured | {head} "
             f"| prefill of the TTFT prompt: bytes per rank ({LINKS[0][0]} ms) |",
             "|---|---|---|---|---|---|" + "---|" * (len(LINKS) + 1)]
    for row in rows:
        t = row.get("traffic")
        if not t:
            continue
        links = " | ".join(f"{link_ms(t, bw, lat):.2f} ({1000 / link_ms(t, bw, lat):.0f})" for _, bw, lat in LINKS)
        p = row["prefill_traffic"]
        lines.append(f"| {row['ranks']} | {row['mode']} | {t['in_row']} x {t['message_bytes']} B "
                     f"| {t['rank_bytes']} | {counted(row['raw']['sent'])} | {row['raw']['comm_ms']:.2f} | {links} "
                     f"| {p['rank_bytes']} ({link_ms(p, *LINKS[0][1:]):.1f}) |")
    return lines


def memory_table(rows: List[dict]) -> List[str]:
    def one(side: str, key: str) -> Optional[int]:
        return rows[0][side].get(key, [None])[0]

    ours_one, raw_one, weights_one, layers_one = (one("ours", "memory"), one("raw", "memory"),
                                                  one("raw", "weights"), one("raw", "layers"))
    lines = ["| ranks | mode | ours active MB per rank (of 1 rank) | raw active MB per rank (of 1 rank) "
             "| weights held MB per rank (of 1 rank) | of which layers, MB (of 1 rank) |", "|---|---|---|---|---|---|"]
    for row in rows:
        o, r = row["ours"], row["raw"]
        if "memory" not in o or "memory" not in r:
            continue
        lines.append(f"| {row['ranks']} | {row['mode']} | {fraction(o['memory'], ours_one)} "
                     f"| {fraction(r['memory'], raw_one)} | {fraction(r['weights'], weights_one)} "
                     f"| {fraction(r['layers'], layers_one)} |")
    return lines


def report(args, rows: List[dict], dims: Dict[str, int], itemsize: int) -> None:
    print(f"model {args.model} (hidden {dims['hidden']}, {dims['layers']} layers), greedy decode of {args.tokens} "
          f"tokens; ours: the server's defaults but for the load option parallel:<mode>; raw: mlx-lm "
          f"stream_generate, the model divided as sharded_load does")
    print(f"TTFT: a prompt of {rows[0]['ours'].get('prompt_tokens', '?')} tokens, ours to the first streamed chunk "
          f"(client side), raw to the first token of stream_generate; 3 streams: {len(STREAMS)} requests at once, "
          f"all tokens over the wall time\n")
    print("\n".join(speed_table(rows)) + "\n")
    links = ", ".join(f"{name} {bw / 1e6:.0f} MB/s and {lat * 1e3:.2f} ms per message" for name, bw, lat in LINKS)
    print(f"Communication in one decode step of one stream (activations of {itemsize} bytes; with B streams in the "
          "batch each message is B times larger). Bytes per rank: worked out for the busiest rank; the kernel's "
          "count: what each rank's ring sockets sent per step while the collectives ran alone (tcp_info), rank 0 "
          "first. Loopback: those collectives timed, slowest rank. Links: assumed " + links + "; ms = messages in "
          "a row x (latency + message / bandwidth); max tok/s: the link alone. Ours adds one control frame from "
          "rank 0 per step, not counted here.\n")
    print("\n".join(comm_table(rows)) + "\n")
    print("Resident memory after load: ours from Status (rank 0's active, rank<N>_active), raw "
          "mx.get_active_memory; weights held: the bytes of each rank's parameters (raw). The embeddings and "
          "output head stay whole on every rank in both modes, so a rank holds 1/N of the layers, not of the "
          "model.\n")
    print("\n".join(memory_table(rows)))


def add_traffic(rows: List[dict], dims: Dict[str, int], itemsize: int) -> None:
    """Each divided row's messages per decode step, and per prefill of the TTFT prompt."""
    for row in rows[1:]:
        if "comm_ms" in row["raw"]:
            row["traffic"] = traffic(row["mode"], row["ranks"], dims["hidden"], dims["layers"], itemsize)
            # A prompt's [1, P, hidden] moves as P rows at once: the same messages, P times larger.
            row["prefill_traffic"] = traffic(row["mode"], row["ranks"], dims["hidden"], dims["layers"], itemsize,
                                             batch=row["raw"]["prompt_tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (random weights, built here), qwen, or a path")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--ranks", default="2,3", help="group sizes past 1, comma-separated")
    parser.add_argument("--modes", default="tensor,pipeline", help="tensor, pipeline or both")
    parser.add_argument("--json", help="write the raw numbers here")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    plan = [(1, "-")] + [(int(n), mode) for n in args.ranks.split(",") for mode in args.modes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = model_path(args.model, workdir)
        dims = shape(path)
        rows = [measure(path, ranks, mode, args.tokens, workdir) for ranks, mode in plan]
    itemsize = rows[0]["raw"].get("itemsize", 4)
    add_traffic(rows, dims, itemsize)
    report(args, rows, dims, itemsize)
    # The machine may be shared: how busy it was says how far to trust the speeds.
    print(f"\nload average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "tokens": args.tokens, "shape": dims,
                                               "links_assumed": LINKS, "rows": rows,
                                               "load_average": [load_before, os.getloadavg()[0]]}, indent=1))


if __name__ == "__main__":
    main()
