#!/usr/bin/env python3
"""`make bench`: our server against raw mlx-lm, like for like, in the same run.

  (a) single-stream decode tok/s            vs mlx_lm.stream_generate
  (b) aggregate tok/s at 1/4/8 streams      vs mlx_lm.batch_generate (max_tokens 64)
  (c) cold time to first token              vs raw prefill + first token
  (d) warm TTFT (second request sharing a ~450-token prefix) vs our cold TTFT;
      our cold TTFT vs raw on the same prompt
  (e) Health p50/p99 while 8 streams decode, polled from a process of its own as a
      host polls it, vs the same polling of our server, idle, while raw
      batch_generate decodes as many streams in its child: what two cores kept busy
      cost a Health call on this machine whoever keeps them busy (runs of their own)
  (f) cancel -> slot free (Status READY), in raw decode steps
  (g) longest pause of a decoding stream while a long prompt is prefilled,
      vs one raw prefill chunk at the long prompt's depth + one raw decode step

How it is like for like:
- Raw mlx-lm lives in a persistent child process that loads the model as our
  server does (the same converted GGUF, the same dtype choice, OpenBLAS) and is
  driven by JSON lines on stdin/stdout. Each measure runs on both sides in
  interleaved rounds (which side goes first alternates), one side at a time,
  the other idle; the table gives the median ratio over rounds and its range.
- The (b) measures run several times a round (twice for 1 stream, four times
  for 4 and 8), ours then raw, then raw then ours, and so on, with fresh
  prompts each time: tokens over seconds of all of them on each side. Our
  streams are read by one event loop, as the host reads them (StreamReader).
- Every prompt is a raw `Prompt` whose first token no earlier prompt had, so
  our prefix cache never helps (except (d)'s warm request, on purpose). The
  raw side gets exactly the token ids our server's TokenizeString returns.
- Speculation off on our side (bench_spec.py measures it against raw mlx-lm).
- Greedy on both sides; both stop at end-of-sequence; the server is loaded
  with prefill_step_size N and raw mlx-lm prefills in chunks of the same N.
"""

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO]

DECODE_TOKENS = 64
SETTLE_S = 0.5
# Openings of documents to continue: greedy decoding rarely meets end-of-sequence in 64 tokens.
TOPICS = [
    "The history of France is long and eventful. It begins",
    "A steam engine works by heating water in a boiler until",
    "The water cycle has four stages. The first stage is",
    "Once upon a time, a dragon lived in a cave above a village, and",
    "Chess is played on a board of sixty-four squares. Each player",
    "The market was busy that morning. Traders shouted",
    "To bake bread, first mix the flour and the water. Then",
    "The old lighthouse keeper climbed the stairs every evening. He",
]


def notes(r: int, n: int, kind: str = "Note") -> str:
    """Filler text, about 27 tokens a note, different in every round."""
    return " ".join(f"{kind} {i}: the archive entry {i} records a shipment of {i * 7 + r} crates "
                    f"of tea to port number {(i + r) % 13}." for i in range(1, n + 1))


# ---- raw mlx-lm: a persistent child process ---------------------------------------


def raw_child(step: int) -> None:
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from libraries must not break the protocol
    import mlx.core as mx
    from mlx_lm import batch_generate, load, stream_generate
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import make_prompt_cache

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import _cast, _choose_dtype, embedded_default

    model, tok = load(str(gguf_to_mlx_dir(embedded_default())))
    dtype = _choose_dtype("auto", model)
    if dtype:
        _cast(model, dtype)
    mx.clear_cache()

    def decode(ids, max_tokens):
        """stream_generate: (seconds since the call, tokens so far) at each token."""
        t0, marks = time.perf_counter(), []
        for r in stream_generate(model, tok, ids, max_tokens=max_tokens, prefill_step_size=step):
            marks.append((time.perf_counter() - t0, r.generation_tokens))
        return {"marks": marks}

    def batch(prompts, max_tokens):
        t0 = time.perf_counter()
        resp = batch_generate(model, tok, prompts, max_tokens=max_tokens, return_token_ids=True,
                              prefill_step_size=step, completion_batch_size=8, prefill_batch_size=8)
        return {"wall": time.perf_counter() - t0, "tokens": sum(len(t) for t in resp.token_ids)}

    def prefill(ids):
        """generate_step's prefill (chunks of `step`) and first token, each chunk timed."""
        t0, chunks = time.perf_counter(), []
        with mx.stream(generation_stream):
            cache, rest = make_prompt_cache(model), mx.array(ids)
            while rest.size > 1:
                n = min(step, rest.size - 1)
                t = time.perf_counter()
                model(rest[:n][None], cache=cache)
                mx.eval([c.state for c in cache])
                chunks.append((n, time.perf_counter() - t))
                rest = rest[n:]
                mx.clear_cache()
            mx.eval(mx.argmax(model(rest[None], cache=cache)[:, -1, :], axis=-1))
        return {"ttft": time.perf_counter() - t0, "chunks": chunks}

    ops = {"decode": decode, "batch": batch, "prefill": prefill}
    answer(ops, dtype, out)



def answer(ops, dtype, out) -> None:
    """A raw child's side of the pipe: its dtype, then one JSON reply per command until quit."""
    out.write(json.dumps({"dtype": dtype or "native"}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.pop("op") == "quit":
            break
        out.write(json.dumps(ops[cmd.pop("fn")](**cmd)) + "\n")
        out.flush()

def served_as(log_path: str) -> str:
    """The model, dtype and context our server logged at its last load (LoadModel's answer says only "loaded")."""
    with open(log_path, "rb") as f:
        lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if "LoadModel: serving " in line]
    return lines[-1].split("LoadModel: serving ", 1)[1] if lines else "unknown (not in the server log)"


def start_raw(step: int, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--raw-child", "--prefill-step", str(step)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)


def ask(proc: subprocess.Popen, fn: str, **args) -> dict:
    proc.stdin.write(json.dumps({"op": "call", "fn": fn, **args}) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("the raw mlx-lm child exited (see the log)")
    return json.loads(line)


def rate(marks) -> float:
    """Decode tok/s after the first token: (time, tokens so far) marks; a mark may carry several tokens."""
    (t0, n0), (t1, n1) = marks[0], marks[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")  # nan: ended at once


# ---- our server over gRPC ---------------------------------------------------------


def prompt_maker(stub, pb):
    """fresh(label, body) -> (text, ids): a prompt whose first token no earlier prompt had."""
    seen = set()

    def words():  # title-case vocabulary words, as a unique leading nonce
        for tid in itertools.count(2000):
            w = stub.Detokenize(pb.DetokenizeRequest(tokens=[tid]), timeout=10).content
            if w.isascii() and w.isalpha() and w.istitle() and len(w) >= 4:
                yield w

    gen = words()

    def fresh(label, body):
        while True:
            text = f"{next(gen)} ({label}): {body}"
            ids = tokenize(stub, pb, text)
            if ids[0] not in seen:
                seen.add(ids[0])
                return text, ids

    return fresh


def tokenize(stub, pb, text):
    return list(stub.TokenizeString(pb.PredictOptions(Prompt=text), timeout=30).tokens)


def ours_stream(stub, pb, text, n, **fields):
    """(send time, [(time, tokens so far)] at each reply, last reply)."""
    t0, marks, last = time.perf_counter(), [], None
    for last in stub.PredictStream(pb.PredictOptions(Prompt=text, Tokens=n, **fields), timeout=600):
        marks.append((time.perf_counter(), last.tokens))
    return t0, marks, last


class StreamReader:
    """Reads concurrent streams as the host does: one process, one event loop, no thread per
    stream (LocalAI's Go process reads each stream in a goroutine). Eight threads of this
    interpreter, each taking the GIL for every reply, cost the two cores about 45% more CPU
    than one loop (0.16 against 0.11 s per 8-stream run of 64 tokens here): time the server's
    figures would pay for, and a host does not take."""

    def __init__(self, addr: str):
        import grpc

        from common.launcher import _Bearer, backend_pb2_grpc

        token = os.environ.get("LOCALAI_GRPC_AUTH_TOKEN", "")
        self.metadata = (_Bearer(token).header,) if token else None
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="stream-reader", daemon=True).start()

        async def connect():
            self.channel = grpc.aio.insecure_channel(addr)
            self.stub = backend_pb2_grpc.BackendStub(self.channel)

        self._run(connect())

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def streams(self, pb, texts, n) -> tuple:
        """(wall seconds from the first send to the last reply, tokens generated) of `texts` at once."""
        async def one(text):
            last = None
            async for last in self.stub.PredictStream(pb.PredictOptions(Prompt=text, Tokens=n), timeout=600,
                                                      metadata=self.metadata):
                pass
            return last.tokens

        async def together():
            t0 = time.perf_counter()
            tokens = await asyncio.gather(*(one(t) for t in texts))
            return time.perf_counter() - t0, sum(tokens)

        return self._run(together())

    def close(self) -> None:
        self._run(self.channel.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


def ours_streams(reader: StreamReader, pb, texts, n, health_addr=None):
    """Concurrent streams: (wall seconds, tokens generated, sorted Health latencies in ms).

    health_addr: Health is polled meanwhile from a process of its own, as the host polls it
    (LocalAI's Go process): a poller in this process would also time the stream reader's hold
    on this interpreter's GIL, which no host has."""
    poller = start_health_poller(health_addr) if health_addr else None
    wall, tokens = reader.streams(pb, texts, n)
    return wall, tokens, sorted(stop_health_poller(poller)) if poller else []


def start_health_poller(addr) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--health-child", addr],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "polling":
        raise RuntimeError("the Health poller did not start")
    return proc


def stop_health_poller(proc) -> list:
    out, _ = proc.communicate("stop\n", timeout=60)
    return json.loads(out)


def health_child(addr: str) -> None:
    """Health every 20 ms until a line on stdin; then the latencies (ms) as one JSON list."""
    import grpc

    from common.launcher import _Bearer, backend_pb2 as pb, backend_pb2_grpc

    channel, token = grpc.insecure_channel(addr), os.environ.get("LOCALAI_GRPC_AUTH_TOKEN", "")
    stub = backend_pb2_grpc.BackendStub(grpc.intercept_channel(channel, _Bearer(token)) if token else channel)
    stub.Health(pb.HealthMessage(), timeout=10)  # the channel is connected before timing starts
    stop, took = threading.Event(), []
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    print("polling", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        stub.Health(pb.HealthMessage(), timeout=5)
        took.append((time.perf_counter() - t0) * 1000)
        stop.wait(0.02)
    print(json.dumps(took), flush=True)


def ours_ttft(stub, pb, text):
    """(client TTFT s, the engine's admit -> first token ms)."""
    t0, marks, last = ours_stream(stub, pb, text, 1)
    return marks[0][0] - t0, last.timing_prompt_processing


def wait_idle(stub, pb):
    while stub.Status(pb.HealthMessage(), timeout=5).state != pb.StatusResponse.READY:
        time.sleep(0.002)


def ours_cancel(stub, pb, text):
    """ms from cancelling a decoding stream to Status READY."""
    call = stub.PredictStream(pb.PredictOptions(Prompt=text, Tokens=1000, IgnoreEOS=True), timeout=600)
    for i, _ in enumerate(call):
        if i == 2:
            break
    t0 = time.perf_counter()
    call.cancel()
    wait_idle(stub, pb)
    return (time.perf_counter() - t0) * 1000


def ours_stall(stub, pb, victim, long_text):
    """Longest gap (ms) between a decoding stream's replies while long_text is prefilled."""
    import grpc

    marks, started = [], threading.Event()
    call = stub.PredictStream(pb.PredictOptions(Prompt=victim, Tokens=1000, IgnoreEOS=True), timeout=600)

    def read():
        try:
            for _ in call:
                marks.append(time.perf_counter())
                if len(marks) == 5:
                    started.set()
        except grpc.RpcError:  # cancelled below
            pass

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(120)
    t_send = time.perf_counter()
    for _ in stub.PredictStream(pb.PredictOptions(Prompt=long_text, Tokens=1), timeout=600):
        pass
    t_done, seen = time.perf_counter(), len(marks)
    while len(marks) < seen + 2 and reader.is_alive():  # the pause spanning the long prompt's exit
        time.sleep(0.005)
    call.cancel()
    reader.join()
    wait_idle(stub, pb)
    return max(b - a for a, b in zip(marks, marks[1:]) if b > t_send and a < t_done) * 1000


# ---- one round: each measure on both sides, one side at a time --------------------


def settle():
    """A pause between the two sides: BLAS worker threads spin a little after work."""
    time.sleep(SETTLE_S)


def paired(raw_first, ours_fn, raw_fn):
    settle()
    first = raw_fn() if raw_first else ours_fn()
    settle()
    second = ours_fn() if raw_first else raw_fn()
    return (second, first) if raw_first else (first, second)


def one_round(r, stub, reader, pb, raw, fresh, step):
    """{measure: (ours, reference)} and extra figures for the JSON."""
    raw_first = r % 2 == 0
    m, extra = {}, {}

    text, ids = fresh(f"run {r} single", TOPICS[r % len(TOPICS)])
    ours, ref = paired(raw_first, lambda: rate(ours_stream(stub, pb, text, DECODE_TOKENS)[1]),
                       lambda: rate(ask(raw, "decode", ids=ids, max_tokens=DECODE_TOKENS)["marks"]))
    m["a"] = (ours, ref)
    step_ms = 1000.0 / ref  # one raw single-stream decode step

    for n in (1, 4, 8):
        # Sets of prompts run A-B, B-A, ...: a slow spell of the machine hits both sides. A run of
        # several streams is noisier here than its ~1% differences: four sets for 4 and 8 streams.
        totals = {"ours": [0, 0.0], "raw": [0, 0.0]}
        for half in range(2 if n == 1 else 4):
            prompts = [fresh(f"run {r}.{half} stream {i} of {n}", TOPICS[(r + i + half) % len(TOPICS)])
                       for i in range(n)]
            (wall, toks, _), rb = paired(
                raw_first != bool(half % 2), lambda: ours_streams(reader, pb, [t for t, _ in prompts], DECODE_TOKENS),
                lambda: ask(raw, "batch", prompts=[i for _, i in prompts], max_tokens=DECODE_TOKENS))
            for side, (k, w) in (("ours", (toks, wall)), ("raw", (rb["tokens"], rb["wall"]))):
                totals[side][0] += k
                totals[side][1] += w
        m[f"b{n}"] = tuple(k / w for k, w in (totals["ours"], totals["raw"]))
        extra[f"b{n}_tokens"] = {side: k for side, (k, _) in totals.items()}

    cold = []
    for i in range(3):
        text, ids = fresh(f"run {r} cold {i}", TOPICS[(r + i) % len(TOPICS)])
        (t, _), rc = paired(raw_first, lambda: ours_ttft(stub, pb, text), lambda: ask(raw, "prefill", ids=ids))
        cold.append((t * 1000, rc["ttft"] * 1000))
    m["c"] = tuple(statistics.median(x) for x in zip(*cold))

    qa, qb = "Question: which port got the most crates?", "Question: how many notes mention port 5?"
    cold_text, cold_ids = fresh(f"run {r} notes", notes(r, 16) + " " + qa)
    warm_text = cold_text[: -len(qa)] + qb
    (c_s, c_engine), rc = paired(raw_first, lambda: ours_ttft(stub, pb, cold_text),
                                 lambda: ask(raw, "prefill", ids=cold_ids))
    settle()
    w_s, w_engine = ours_ttft(stub, pb, warm_text)
    m["d_cold"] = (c_s * 1000, rc["ttft"] * 1000)
    m["d_warm"] = (w_s * 1000, c_s * 1000)
    m["d_warm_engine"] = (w_engine, None)
    m["d_warm_outside"] = (w_s * 1000 - w_engine, None)
    extra["d_prompt_tokens"] = len(cold_ids)
    extra["d_cold_engine_ms"] = c_engine

    settle()
    m["f"] = (ours_cancel(stub, pb, fresh(f"run {r} cancel", TOPICS[r % len(TOPICS)])[0]), step_ms)

    victim = fresh(f"run {r} victim", TOPICS[(r + 3) % len(TOPICS)])[0]
    long_text, long_ids = fresh(f"run {r} long", "Summarise these notes. " + notes(r, 16) + " " +
                                notes(r, 16, "Entry"))
    pause, rg = paired(raw_first, lambda: ours_stall(stub, pb, victim, long_text),
                       lambda: ask(raw, "prefill", ids=long_ids))
    full = [s for n, s in rg["chunks"] if n == step] or [s for _, s in rg["chunks"]]
    m["g"] = (pause, full[-1] * 1000 + step_ms)  # the deepest full chunk + one decode step
    extra["g_prompt_tokens"] = len(long_ids)
    extra["g_chunk_ms"] = full[-1] * 1000
    return m, extra


# ---- report -----------------------------------------------------------------------

ROWS = [  # key, label, target
    ("a", "(a) 1-stream decode tok/s vs stream_generate", ">= 0.97x"),
    ("b1", "(b) aggregate tok/s, 1 stream vs batch_gen", ""),
    ("b4", "(b) aggregate tok/s, 4 streams vs batch_gen", ""),
    ("b8", "(b) aggregate tok/s, 8 streams vs batch_gen", ">= 0.97x"),
    ("c", "(c) cold TTFT ms vs raw prefill+1st token", ""),
    ("d_cold", "(d) cold TTFT ms, ~450-tok prompt vs raw", ""),
    ("d_warm", "(d) warm TTFT ms vs our cold TTFT", "<= 0.10x"),
    ("d_warm_engine", "(d)   warm: engine admit->first token ms", ""),
    ("d_warm_outside", "(d)   warm: outside the engine ms", ""),
    ("e_p50", "(e) Health p50 ms, 8 streams vs raw decoding", ""),
    ("e_p99", "(e) Health p99 ms, 8 streams vs raw decoding", "p99 <= 10 ms"),
    ("f", "(f) cancel -> slot free ms vs raw step", ""),
    ("g", "(g) longest pause ms vs raw chunk+step", ""),
]


def quantile(samples, q: float) -> float:
    """The sample at rank int(n * q): (e)'s p50 and p99 as every earlier run of this bench took
    them, so its figures stay comparable (peer_report.percentile interpolates, as numpy does).
    The summary's (e) "ratio median" is of these quantiles over all samples of a side."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summarise(rounds):
    out = {}
    for key in rounds[0]:
        pairs = [rd[key] for rd in rounds if rd[key][0] == rd[key][0] and rd[key][1] == rd[key][1]]
        ours, refs = [o for o, _ in pairs], [ref for _, ref in pairs]  # without nan (a stream that ended at once)
        if not ours:
            continue
        s = {"ours": ours, "reference": refs, "ours_median": statistics.median(ours)}
        if refs[0] is not None:
            ratios = [o / ref for o, ref in zip(ours, refs)]
            s.update(reference_median=statistics.median(refs), ratios=ratios,
                     ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
        out[key] = s
    return out


def table(summary) -> str:
    lines = [f"{'measure':46} {'ours':>9} {'reference':>9}  {'ratio median [min..max]':24} target", "-" * 100]
    for key, label, target in ROWS:
        s = summary.get(key)
        if s is None:
            lines.append(f"{label:46} {'n/a':>9}")
            continue
        ref = f"{s['reference_median']:9.1f}" if "ratio_median" in s else " " * 9
        ratio = (f"{s['ratio_median']:.2f}x [{s['ratio_min']:.2f}..{s['ratio_max']:.2f}]"
                 if "ratio_median" in s else "")
        lines.append(f"{label:46} {s['ours_median']:9.1f} {ref}  {ratio:24} {target}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5: about 7-11 min here)")
    parser.add_argument("--prefill-step", type=int, default=128,
                        help="prefill chunk in tokens, for our server and raw mlx-lm alike (default 128)")
    parser.add_argument("--out", default=os.path.join(REPO, "bench-results.json"))
    parser.add_argument("--log", default=os.path.join(REPO, "bench-server.log"))
    parser.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--health-child", metavar="ADDR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_child:
        raw_child(args.prefill_step)
        return
    if args.health_child:
        health_child(args.health_child)
        return

    from common.launcher import Backend, backend_pb2 as pb

    began = time.monotonic()
    log = open(args.log, "ab")
    raw = start_raw(args.prefill_step, log)  # loads while the server starts
    # Its own prefix-cache folder, removed after: files an earlier run left (the disk tier is on
    # by default, and these prompts are the same every run) would make a cold measure warm.
    folder = tempfile.mkdtemp(prefix="bench-prompt-cache-")
    try:
        with Backend(log_path=args.log, env={"MLX_BACKEND_PROMPT_CACHE_DIR": folder}) as b:
            stub = b.stub
            # Plain decoding against plain decoding: speculation has its own bench (bench_spec.py).
            loaded = b.load("", Options=[f"prefill_step_size:{args.prefill_step}", "speculation:off"])
            assert loaded.success, loaded.message
            hello = raw.stdout.readline()
            if not hello:
                raise RuntimeError("the raw mlx-lm child failed to load the model (see the log)")
            raw_dtype = json.loads(hello)["dtype"]
            ours_dtype = served_as(args.log)
            print(f"ours: {ours_dtype}; raw mlx-lm: dtype {raw_dtype}", file=sys.stderr)
            fresh = prompt_maker(stub, pb)
            reader = StreamReader(b.addr)

            # Warm-up on both sides (first calls allocate and build kernels).
            text, ids = fresh("warm-up", TOPICS[0])
            ours_stream(stub, pb, text, 16)
            ask(raw, "decode", ids=ids, max_tokens=16)
            prompts = [fresh(f"warm-up {i}", q) for i, q in enumerate(TOPICS)]
            ours_streams(reader, pb, [t for t, _ in prompts], 8)
            ask(raw, "batch", prompts=[i for _, i in prompts], max_tokens=8)
            text, ids = fresh("warm-up long", notes(0, 20))
            ours_ttft(stub, pb, text)
            ask(raw, "prefill", ids=ids)

            rounds, extras = [], []
            for r in range(args.rounds):
                t0 = time.monotonic()
                m, extra = one_round(r, stub, reader, pb, raw, fresh, args.prefill_step)
                print(f"round {r + 1}/{args.rounds} ({'raw' if r % 2 == 0 else 'ours'} first): "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
                rounds.append(m)
                extras.append(extra)

            # (e) Health from another process while 8 streams decode, runs of their own, two
            # a side in turn; the reference polls our idle server while raw mlx-lm decodes.
            health = {"ours": [], "raw": []}
            for i in range(4):
                texts = [fresh(f"health {i}.{j}", q) for j, q in enumerate(TOPICS)]
                settle()
                if i % 2 == 0:
                    health["ours"].append(ours_streams(reader, pb, [t for t, _ in texts], 2 * DECODE_TOKENS,
                                                       health_addr=b.addr)[2])
                else:
                    poller = start_health_poller(b.addr)
                    ask(raw, "batch", prompts=[ids for _, ids in texts], max_tokens=2 * DECODE_TOKENS)
                    health["raw"].append(stop_health_poller(poller))
            reader.close()
    finally:
        if raw.poll() is None:
            raw.stdin.write(json.dumps({"op": "quit"}) + "\n")
            raw.stdin.close()
            raw.wait(30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)

    summary = summarise(rounds)
    for key, q in (("e_p50", 0.5), ("e_p99", 0.99)):  # of all samples of a side; the range: run by run
        ours, ref = (quantile(sum(health[side], []), q) for side in ("ours", "raw"))
        runs = [quantile(o, q) / quantile(r, q) for o, r in zip(health["ours"], health["raw"])]
        summary[key] = {"ours_median": ours, "reference_median": ref, "ratio_median": ours / ref,
                        "ratio_min": min(runs), "ratio_max": max(runs)}
    print(table(summary))
    took = time.monotonic() - began
    print(f"\n{args.rounds} rounds, prefill chunk {args.prefill_step}, Health samples {sum(map(len, health['ours']))} "
          f"(ours) and {sum(map(len, health['raw']))} (raw decoding), {took / 60:.1f} min; figures written to {args.out}",
          file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"rounds": args.rounds, "prefill_step_size": args.prefill_step, "decode_tokens": DECODE_TOKENS,
                   "dtype": {"ours": ours_dtype, "raw": raw_dtype}, "summary": summary,
                   "per_round_extra": extras, "health_ms": health, "seconds": took}, f, indent=2)


if __name__ == "__main__":
    main()
