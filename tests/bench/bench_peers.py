#!/usr/bin/env python3
"""`make bench-peers`: our server against the servers users would pick instead, on a chat trace.

A seeded trace (peer_trace: short questions and ~400-token documents to summarise, 32-128
tokens each, greedy, arriving as a Poisson process) is replayed against each server in turn,
one server at a time, each started fresh for each load and stopped after it:
- ours over gRPC as LocalAI sends chat (Messages through the template, UseTokenizerTemplate,
  PredictStream, a random seed per request, TopP 0.95), loaded with defaults;
- mlx_lm.server, vllm-mlx (`--continuous-batching`) and rapid-mlx over their OpenAI-compatible
  streamed chat completions (the same messages, max tokens and temperature), each from a venv
  of its own outside the repository, installed on first use (peer_venvs), or skipped with one line.
Every server loads the same float32 SmolLM2-135M directory (peer_model) with OpenBLAS preloaded.
The same requests run at the trace's rate and again all at once. Per server and load:
throughput (output tokens / trace wall time), TTFT, TPOT and E2E p50/p99 (peer_report).
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable, ContextManager, Dict, Iterator, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, HERE]

import peer_model  # noqa: E402
import peer_report  # noqa: E402
import peer_servers  # noqa: E402
import peer_trace  # noqa: E402
import peer_venvs  # noqa: E402
from bench import served_as  # noqa: E402
from peer_replay import Record, Send, grpc_sender, http_sender, replay  # noqa: E402

log = logging.getLogger("bench-peers")

WARM_UP = peer_trace.TraceRequest(index=-1, arrival_s=0.0, kind="warm-up", prompt="Say hello in one sentence.",
                                  max_tokens=8, temperature=0.0, seed=1)


def our_commit() -> str:
    out = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


@contextlib.contextmanager
def ours(model: str, log_path: str, report: Dict) -> Iterator[Send]:
    """Our server with its defaults, on a prefix-cache folder of its own for the one run."""
    from common.launcher import Backend, backend_pb2 as pb

    with tempfile.TemporaryDirectory(prefix="bench-peers-prompt-cache-") as folder:
        b = Backend(log_path=log_path, env={"MLX_BACKEND_PROMPT_CACHE_DIR": folder})
        try:
            b.wait_healthy(peer_servers.START_TIMEOUT_S)  # the same patience as for the peers
            loaded = b.load(model)
            if not loaded.success:
                raise RuntimeError(f"LoadModel failed: {loaded.message}")
            report["openblas"] = peer_servers.uses_openblas(b.proc.pid)
            report["served_as"] = served_as(log_path)
            yield grpc_sender(b.stub, pb, model)
        finally:
            b.stop()


@contextlib.contextmanager
def peer(p: peer_servers.Peer, python: str, model: str, log_path: str, count: Callable[[str], int],
         report: Dict) -> Iterator[Send]:
    with peer_servers.running(p, python, model, log_path, report) as port:
        yield http_sender(port, model, count)


Opener = Callable[[Dict], ContextManager[Send]]  # (a dict for what the server reports) -> the server while it runs


def run_one(open_server: Opener, trace, report: Dict) -> Tuple[List[Record], float, float]:
    """Start the server, send one warm-up request (first calls build kernels), replay the trace."""
    with open_server(report) as send:
        warm = Record(index=-1, kind="warm-up")
        send(WARM_UP, warm)
        if not warm.text:
            raise RuntimeError(f"the warm-up request got no text back ({warm.error or 'no error'})")
        return replay(trace, send)


def one_load(load: str, trace, servers: Dict[str, Opener], labels: Dict[str, str]) -> Dict[str, Dict]:
    """{server: its figures, what it reported and every request's timings}, one server after another;
    a server that fails to start or to answer the warm-up is skipped with one line."""
    out = {}
    for name, open_server in servers.items():
        report, t0 = {}, time.monotonic()
        try:
            records, start, end = run_one(open_server, trace, report)
        except Exception as e:
            print(f"skipped {name} at load '{load}': {type(e).__name__}: {e}", file=sys.stderr)
            continue
        figures = peer_report.summarise(records, start, end)
        log.info("%s, load %s: %d/%d requests in %.0f s (%.0f s with start and stop)", name, load,
                 figures["completed"], figures["requests"], figures["wall_s"], time.monotonic() - t0)
        out[name] = {"label": labels[name], "figures": figures, **report,
                     "records": peer_report.timeline(records, start)}
    ours_text = {r["index"]: r["text"] for r in out.get("ours", {}).get("records", [])}
    for s in out.values():  # greedy on the same weights: how many answers are ours to the letter
        s["same_text_as_ours"] = sum(ours_text.get(r["index"]) == r["text"] for r in s["records"])
    return out


def install_peers(names: List[str], root: str, log_dir: str, install: bool) -> Dict[str, str]:
    """{peer name: its venv's python} for the peers that are (or now get) installed; one line per skip."""
    pythons = {}
    for p in peer_servers.selected(names):
        venv = os.path.join(root, p.name)
        if not install and not peer_venvs.is_ready(venv, p.packages):
            print(f"skipped {p.name}: not installed in {venv} (--no-install)", file=sys.stderr)
            continue
        python = peer_venvs.ensure(venv, p.packages, os.path.join(log_dir, f"bench-peers-pip-{p.name}.log"))
        if python is None:
            print(f"skipped {p.name}: pip could not install {' '.join(p.packages)} "
                  f"(see {os.path.join(log_dir, f'bench-peers-pip-{p.name}.log')})", file=sys.stderr)
            continue
        pythons[p.name] = python
    return pythons


def parse_args():
    d = peer_trace.TraceSpec()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=d.requests, help=f"requests in the trace (default {d.requests})")
    ap.add_argument("--rate", type=float, default=d.rate,
                    help=f"Poisson arrivals per second (default {d.rate}); 0: all at once")
    ap.add_argument("--documents", type=float, default=d.document_share,
                    help=f"share of requests that summarise a long document (default {d.document_share})")
    ap.add_argument("--document-tokens", type=int, default=d.document_tokens,
                    help=f"length of a document in tokens (default {d.document_tokens})")
    ap.add_argument("--min-tokens", type=int, default=d.min_tokens, help=f"least max tokens (default {d.min_tokens})")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"most max tokens (default {d.max_tokens})")
    ap.add_argument("--temperature", type=float, default=d.temperature,
                    help="sampling temperature of every request (default 0: greedy)")
    ap.add_argument("--seed", type=int, default=d.seed, help=f"the trace's seed (default {d.seed})")
    ap.add_argument("--loads", default="rate,once",
                    help="which loads to run, in order: rate (the trace's arrivals), once (all at once)")
    ap.add_argument("--servers", default="ours," + ",".join(p.name for p in peer_servers.PEERS),
                    help="servers to run, in order (default: ours and every peer)")
    ap.add_argument("--model", default="",
                    help="model directory for every server (default: the embedded SmolLM2 as float32)")
    ap.add_argument("--peers-dir", default=os.environ.get("MLX_BENCH_PEERS_DIR") or peer_venvs.default_root(),
                    help="where the peers' venvs and the float32 model live (default %(default)s)")
    ap.add_argument("--no-install", action="store_true", help="skip peers that are not installed yet")
    ap.add_argument("--out", default=os.path.join(REPO, "bench-results-peers.json"))
    ap.add_argument("--log-dir", default=REPO, help="where the servers' logs go (bench-peers-*.log)")
    args = ap.parse_args()
    bad = [x for x in args.loads.split(",") if x not in ("rate", "once")]
    if bad or args.requests < 1 or args.rate < 0 or not 0 <= args.documents <= 1 or \
            not 1 <= args.min_tokens <= args.max_tokens:
        ap.error("check --loads (rate, once), --requests >= 1, --rate >= 0, --documents in [0, 1], "
                 "1 <= --min-tokens <= --max-tokens")
    return args


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args = parse_args()
    began = time.monotonic()
    names = [s for s in args.servers.split(",") if s]
    pythons = install_peers([n for n in names if n != "ours"], args.peers_dir, args.log_dir, not args.no_install)
    names = [n for n in names if n == "ours" or n in pythons]

    model = args.model or str(peer_model.float32_dir(args.peers_dir))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    spec = peer_trace.TraceSpec(requests=args.requests, rate=args.rate, document_share=args.documents,
                                min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                                document_tokens=args.document_tokens, temperature=args.temperature, seed=args.seed)
    trace = peer_trace.generate(spec, count)
    loads = {"rate": trace, "once": peer_trace.all_at_once(trace)}
    labels = {"ours": f"ours ({our_commit()}, defaults)", **{p.name: p.label for p in peer_servers.PEERS}}

    servers = {}
    for name in names:
        log_path = os.path.join(args.log_dir, f"bench-peers-{name}.log")
        servers[name] = (functools.partial(ours, model, log_path) if name == "ours" else
                         functools.partial(peer, peer_servers.BY_NAME[name], pythons[name], model, log_path, count))

    results = {"trace": dataclasses.asdict(spec), "model": model, "machine": platform.platform(),
               "requests": [dict(dataclasses.asdict(r), prompt_tokens=count(r.prompt)) for r in trace],
               "versions": {name: peer_venvs.versions(python)
                            for name, python in {"ours": sys.executable, **pythons}.items()}, "loads": {}}
    tables = []
    for load in args.loads.split(","):
        per_server = one_load(load, loads[load], servers, labels)
        results["loads"][load] = per_server
        title = (f"{spec.requests} requests arriving at {spec.rate}/s" if load == "rate" and spec.rate > 0
                 else f"{spec.requests} requests all at once")
        rows = [{"server": s["label"], "figures": s["figures"]} for s in per_server.values()]
        tables.append(f"### {title}\n\n{peer_report.table(rows)}")
    results["seconds"] = time.monotonic() - began
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print("\n\n".join(tables))
    print(f"\n{time.monotonic() - began:.0f} s in all; figures and every request's timings in {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
