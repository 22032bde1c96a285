#!/usr/bin/env python3
"""`make bench BENCH=prefix`: the prefix cache as users hit it (issue 22), against raw mlx-lm.

  (h) hybrid and sliding-window models (bench-sized random qwen3_next and gemma3_text): a
      chat's second turn sharing ~1000 prompt tokens with the first, (i) with the exact
      reply in the history, (ii) with the assistant message edited. Warm TTFT over cold TTFT
      of a prompt of the same shape and length.
  (r) restart: serve a prompt, SIGTERM the server, start a new one (same model, same
      MLX_BACKEND_CACHE_DIR), send a prompt sharing a ~450-token prefix: TTFT over cold TTFT;
      start-up (spawn to Health) and LoadModel seconds with the disk tier against
      `prompt_cache_disk_bytes:0`.
  (p) plain KV (SmolLM2, float32): a second question about the same ~450-token document
      (same chat template, a different last line): warm TTFT over cold TTFT.

Requests go as LocalAI sends them: chat `Messages` through the model's template
(`UseTokenizerTemplate`), a random seed, Temperature 0.9, TopP 0.95; the server runs with its
defaults. TTFT is the client's time from sending PredictStream to its first reply.

How it is like for like: raw mlx-lm runs in a persistent child process that loads the same
model directory (SmolLM2 cast as our server casts it) and gets exactly the token ids our
server's TokenizeString returns for the same request. Its warm side is mlx-lm's own prompt
cache (`LRUPromptCache`, as mlx-lm's server keeps it): before a warm measure the child is
given the cache state our server holds at that point (the first turn's prompt and reply ids,
prefilled untimed); the timed part is the cache fetch (mlx-lm deep-copies the entry and trims
it), the prefill of the rest in chunks of our server's size, and the first sampled token, as
mlx-lm's generate_step makes it (a last-token pass of its own, the next step already queued);
the table also gives the floor: the fetch, one forward pass over the rest and a sample. Its
cold side prefills from an empty cache with generate_step. Each cold measure uses a prompt of the same shape
whose first words no earlier prompt had (the chat template's first few tokens are shared by
every prompt). Sides run one at a time, alternating which goes first.
"""

import argparse
import atexit
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), os.path.join(REPO, "tests"), REPO]

from bench import answer, paired as pair, settle  # noqa: E402  (one side at a time, as the main bench)

REPLY_TOKENS = 24  # the first turn's reply
MEASURE_TOKENS = 4  # a measured request decodes a few tokens, as a chat does (TTFT is its first reply)
STEP = 128  # our server's default prefill chunk on the CPU (engine/core.py); raw mlx-lm prefills alike

# Bench-sized random models: a cold prefill of ~1000 tokens takes ~1 s or more here.
# Sliding window 512 (Gemma 3's) so a ~1000-token prompt wraps the rotating caches.
BENCH_SIZES = {
    "gemma3_text": dict(hidden_size=384, num_hidden_layers=16, intermediate_size=1024, num_attention_heads=6,
                        num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64, sliding_window=512,
                        sliding_window_pattern=6),
    "qwen3_next": dict(hidden_size=384, num_hidden_layers=8, intermediate_size=1024, num_attention_heads=6,
                       num_key_value_heads=2, head_dim=64, linear_num_value_heads=8, linear_num_key_heads=4,
                       linear_key_head_dim=32, linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=256, shared_expert_intermediate_size=256, full_attention_interval=4),
}
NONCES = ["Amber", "Birch", "Cobalt", "Delta", "Ember", "Fjord", "Garnet", "Harbor", "Indigo", "Juniper",
          "Kestrel", "Lumen", "Marble", "Nectar", "Onyx", "Pepper", "Quartz", "Raven", "Saffron", "Tundra",
          "Umber", "Velvet", "Willow", "Xenon", "Yarrow", "Zephyr"]


def document(tag: str, notes: int) -> str:
    """About 27 tokens a note; `tag` makes the first words of the prompt unique."""
    body = " ".join(f"Note {i}: the archive entry {i} records a shipment of {i * 7 + len(tag)} crates "
                    f"of tea to port number {i % 13}." for i in range(1, notes + 1))
    return f"{tag} archive. {body}"


# ---- raw mlx-lm: a persistent child process ---------------------------------------


def raw_child(model_dir: str, cast: bool) -> None:
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from libraries must not break the protocol
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    from loaders.model_loader import _cast, _choose_dtype

    model, _ = load(model_dir)
    dtype = _choose_dtype("auto", model) if cast else None
    if dtype:
        _cast(model, dtype)
    mx.clear_cache()
    lru = LRUPromptCache(max_size=64)

    def first_token(ids, warm, one_pass=False):
        """Seconds to the first sampled token: [cache fetch,] prefill of the rest, sample.

        As mlx-lm's generate_step does it (all but the last token in chunks, then the last
        token, the next step already queued), or with `one_pass` the floor: the whole rest
        (at most one chunk) in one forward pass and a sample from its last logits."""
        sampler = make_sampler(temp=0.9, top_p=0.95)
        mx.random.seed(random.randrange(1 << 30))
        t0 = time.perf_counter()
        cache, rest = lru.fetch_nearest_cache("model", ids) if warm else (None, ids)
        cache = cache if cache is not None else make_prompt_cache(model)
        if one_pass:
            logits = model(mx.array(rest)[None], cache=cache)[:, -1, :]
            token = sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
            mx.eval(token, [c.state for c in cache])
        else:
            token, _ = next(generate_step(mx.array(rest), model, prompt_cache=cache, sampler=sampler,
                                          prefill_step_size=STEP, max_tokens=1))
        took = time.perf_counter() - t0
        return {"ttft": took, "cached": len(ids) - len(rest), "token": int(token)}

    def remember(ids):
        """Hold the cache state of `ids` (prefilled now, untimed), as after serving them."""
        cache = make_prompt_cache(model)
        rest = mx.array(ids)
        for i in range(0, len(ids), STEP):
            model(rest[i:i + STEP][None], cache=cache)
            mx.eval([c.state for c in cache])
        lru.insert_cache("model", list(ids), cache)
        return {}

    ops = {"first_token": first_token, "remember": remember}
    answer(ops, dtype, out)


class Raw:
    def __init__(self, model_dir: str, cast: bool, log):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--raw-child", model_dir] + (["--cast"] if cast else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError("the raw mlx-lm child failed to load the model (see the log)")
        self.dtype = json.loads(hello)["dtype"]

    def ask(self, fn: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": "call", "fn": fn, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the raw mlx-lm child exited (see the log)")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(30)


# ---- our server, as LocalAI calls it ------------------------------------------------


def chat_request(pb, messages, tokens):
    return pb.PredictOptions(
        Messages=[pb.Message(role=role, content=text) for role, text in messages], UseTokenizerTemplate=True,
        Tokens=tokens, Temperature=0.9, TopP=0.95, Seed=random.randrange(1, 1 << 30))


def word_bias(model_dir: str, n: int = 400) -> str:
    """LogitBias (JSON) favouring `n` whole-word tokens (" word") that re-tokenize as themselves.

    A random model's reply is a string of arbitrary pieces that re-tokenize differently
    once the host sends it back (" sk"+"ir"+"tes" for " skirt"+"es"), so its second turn
    would never extend the first token for token; a real model's reply mostly does. The
    first turn of a random model is steered to such words so the exact-reply case is
    what it is with a real model (the measured second turn carries no bias)."""
    import re

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    words = []
    for t in range(len(tok)):
        s = tok.decode([t])
        if re.fullmatch(r" [a-z]{3,}", s) and tok.encode(s, add_special_tokens=False) == [t]:
            words.append(t)
            if len(words) == n:
                break
    return json.dumps({str(t): 30.0 for t in words})


def ours(stub, pb, messages, tokens=MEASURE_TOKENS, logprobs=False, bias=""):
    """(client TTFT ms, engine admit -> first token ms, reply text, generated ids or their count)."""
    request = chat_request(pb, messages, tokens)
    if logprobs:  # only to learn the generated ids (the first turn): its replies carry them
        request.Logprobs = 1
    request.LogitBias = bias
    t0 = time.perf_counter()
    first, text, last = None, [], None
    for last in stub.PredictStream(request, timeout=600):
        if first is None:
            first = time.perf_counter()
        text.append(last.message.decode("utf-8", "replace"))
    generated = ([e["id"] for e in json.loads(last.logprobs)["content"]] if logprobs and last.logprobs
                 else last.tokens)
    return (first - t0) * 1000, last.timing_prompt_processing, "".join(text), generated


def ids_of(stub, pb, messages):
    return list(stub.TokenizeString(chat_request(pb, messages, 1), timeout=60).tokens)


# ---- (h) and (p): a chat's second turn ----------------------------------------------


def second_turn_round(r, stub, pb, raw, case, doc_notes, nonces, bias=""):
    """One warm/cold measure of `case` ("exact", "edited" or "question"): a dict of figures."""
    raw_first = r % 2 == 0
    doc = document(next(nonces), doc_notes)
    q1, q2 = "Which port got the most crates?", "How many notes mention port 5?"
    if case == "question":  # one user message: the document, then a different last line
        turn1 = [("user", f"{doc}\n{q1}")]
        turn2 = lambda d, reply: [("user", f"{d}\n{q2}")]  # noqa: E731
    else:
        turn1 = [("system", doc), ("user", q1)]
        turn2 = lambda d, reply: [("system", d), ("user", q1), ("assistant", reply), ("user", q2)]  # noqa: E731

    _, _, reply, generated = ours(stub, pb, turn1, REPLY_TOKENS, logprobs=True, bias=bias)  # the first turn, served
    ids1 = ids_of(stub, pb, turn1)
    history = reply if case != "edited" else "Port 3, I believe. " + reply[: len(reply) // 2]
    warm_msgs = turn2(doc, history)
    warm_ids = ids_of(stub, pb, warm_msgs)
    # Raw mlx-lm holds what our server holds after the first turn: its prompt and the generated ids.
    held = ids1 + generated
    raw.ask("remember", ids=held)
    (w_ms, w_engine, _, _), rw = pair(raw_first, lambda: ours(stub, pb, warm_msgs),
                                      lambda: raw.ask("first_token", ids=warm_ids, warm=True))

    cold_msgs = turn2(document(next(nonces), doc_notes), history)  # same shape, never seen
    cold_ids = ids_of(stub, pb, cold_msgs)
    (c_ms, c_engine, _, _), rc = pair(raw_first, lambda: ours(stub, pb, cold_msgs),
                                      lambda: raw.ask("first_token", ids=cold_ids, warm=False))
    settle()
    floor = float("nan")  # only for a hit whose rest fits one pass
    if rw["cached"] and len(warm_ids) - rw["cached"] <= STEP:
        floor = raw.ask("first_token", ids=warm_ids, warm=True, one_pass=True)["ttft"] * 1000
    return {"warm": w_ms, "cold": c_ms, "warm_engine": w_engine, "cold_engine": c_engine,
            "raw_warm": rw["ttft"] * 1000, "raw_floor": floor, "raw_cold": rc["ttft"] * 1000,
            "raw_cached": rw["cached"],
            "prompt_tokens": len(warm_ids), "cold_prompt_tokens": len(cold_ids), "shared": len(ids1),
            # whether the re-rendered history extends the held tokens exactly (a random model's
            # reply may re-tokenize differently; then only the first turn's prompt is shared)
            "extends": int(warm_ids[:len(held)] == held)}


RUN_FOLDER = tempfile.mkdtemp(prefix="bench-prefix-run-")
atexit.register(shutil.rmtree, RUN_FOLDER, True)


def serve(model_dir, log_path, env=None, options=()):
    """A started server with `model_dir` loaded: (backend, start-up s, LoadModel s)."""
    from common.launcher import Backend

    # The prefix cache's files go where the scenario says (the restart's folder), else to
    # this run's own folder: never where an earlier run left files a cold measure would hit.
    env = dict(env or {})
    env["MLX_BACKEND_PROMPT_CACHE_DIR"] = os.path.join(env.get("MLX_BACKEND_CACHE_DIR", RUN_FOLDER), "prompt-cache")
    t0 = time.perf_counter()
    b = Backend(env=env, log_path=log_path)
    b.wait_healthy(120)
    t1 = time.perf_counter()
    loaded = b.load(model_dir, Options=list(options))
    t2 = time.perf_counter()
    if not loaded.success:
        b.stop()
        raise RuntimeError(f"LoadModel failed: {loaded.message}")
    return b, t1 - t0, t2 - t1


def warm_up(stub, pb, raw, nonces):
    text = document(next(nonces), 6)
    ours(stub, pb, [("user", text)], 8)
    ids = ids_of(stub, pb, [("user", text)])
    raw.ask("first_token", ids=ids, warm=False)


def chat_bench(name, model_dir, cast, cases, doc_notes, rounds, log_path, log, nonces, bias=""):
    """Each case over `rounds` rounds on one server and one raw child: {case: [round figures]}."""
    from common.launcher import backend_pb2 as pb

    raw = Raw(model_dir, cast, log)
    b, _, _ = serve(model_dir, log_path)
    try:
        warm_up(b.stub, pb, raw, nonces)
        out = {c: [] for c in cases}
        for r in range(rounds):
            for c in cases:
                t0 = time.monotonic()
                out[c].append(second_turn_round(r, b.stub, pb, raw, c, doc_notes, nonces, bias))
                shown = {k: round(v) if v == v else None for k, v in out[c][-1].items()}  # nan: no floor
                print(f"{name} {c} round {r + 1}/{rounds}: {time.monotonic() - t0:.0f} s {json.dumps(shown)}",
                      file=sys.stderr)
        return out
    finally:
        b.stop()
        raw.close()


# ---- (r): a restart -------------------------------------------------------------------


def restart_round(r, model_dir, raw, log_path, nonces):
    """Serve, SIGTERM, serve again from the same cache folder; then a start without the disk tier."""
    from common.launcher import backend_pb2 as pb

    folder = tempfile.mkdtemp(prefix="bench-prefix-cache-")
    bare = tempfile.mkdtemp(prefix="bench-prefix-nocache-")
    try:
        env = {"MLX_BACKEND_CACHE_DIR": folder}
        doc = document(next(nonces), 16)
        q1, q2 = "Which port got the most crates?", "How many notes mention port 5?"
        b, _, _ = serve(model_dir, log_path, env)
        try:
            ours(b.stub, pb, [("user", f"{doc}\n{q1}")], REPLY_TOKENS)
        finally:
            b.stop()  # SIGTERM, as the host stops a backend
        b, up_s, load_s = serve(model_dir, log_path, env)
        try:
            warm_msgs = [("user", f"{doc}\n{q2}")]
            w_ms, w_engine, _, _ = ours(b.stub, pb, warm_msgs)
            settle()
            cold_msgs = [("user", f"{document(next(nonces), 16)}\n{q2}")]
            cold_ids = ids_of(b.stub, pb, cold_msgs)
            c_ms, c_engine, _, _ = ours(b.stub, pb, cold_msgs)
        finally:
            b.stop()
        rc = raw.ask("first_token", ids=cold_ids, warm=False)
        b, up0_s, load0_s = serve(model_dir, log_path, {"MLX_BACKEND_CACHE_DIR": bare},
                                  ["prompt_cache_disk_bytes:0"])
        b.stop()
        files = sum(len(f) for _, _, f in os.walk(folder))
        return {"warm": w_ms, "cold": c_ms, "warm_engine": w_engine, "cold_engine": c_engine,
                "raw_cold": rc["ttft"] * 1000, "startup_s": up_s, "load_s": load_s,
                "startup_off_s": up0_s, "load_off_s": load0_s, "cache_files": files,
                "prompt_tokens": len(cold_ids)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(bare, ignore_errors=True)


def restart_bench(model_dir, rounds, log_path, log, nonces):
    raw = Raw(model_dir, True, log)
    try:
        out = []
        for r in range(rounds):
            t0 = time.monotonic()
            out.append(restart_round(r, model_dir, raw, log_path, nonces))
            print(f"restart round {r + 1}/{rounds}: {time.monotonic() - t0:.0f} s "
                  f"{json.dumps({k: round(v, 2) for k, v in out[-1].items()})}", file=sys.stderr)
        return {"restart": out}
    finally:
        raw.close()


# ---- report -----------------------------------------------------------------------


def med(rows, key):
    return statistics.median(x[key] for x in rows)


def ratio(rows, num, den):
    rs = [x[num] / x[den] for x in rows]
    return f"{statistics.median(rs):.2f}x [{min(rs):.2f}..{max(rs):.2f}]"


def table(results) -> str:
    lines = [f"{'scenario':34} {'ours warm/cold ms':>18} {'warm/cold':>20} {'raw warm/cold ms':>17} "
             f"{'raw warm/cold':>20} {'ours/raw warm':>20} {'ours/raw cold':>20}  target", "-" * 170]
    targets = {"exact": "<= 0.15x", "edited": "<= 0.15x", "question": "<= 0.10x", "restart": "<= 0.15x"}
    for (name, case), rows in results.items():
        raw_w = f"{med(rows, 'raw_warm'):7.0f}/" if "raw_warm" in rows[0] else "      -/"
        lines.append(
            f"{name + ' ' + case:34} {med(rows, 'warm'):8.0f}/{med(rows, 'cold'):<9.0f} "
            f"{ratio(rows, 'warm', 'cold'):>20} {raw_w}{med(rows, 'raw_cold'):<9.0f} "
            f"{ratio(rows, 'raw_warm', 'raw_cold') if 'raw_warm' in rows[0] else '':>20} "
            f"{ratio(rows, 'warm', 'raw_warm') if 'raw_warm' in rows[0] else '':>20} "
            f"{ratio(rows, 'cold', 'raw_cold'):>20}  {targets.get(case, '')}")
        lines.append(f"{'':34} engine admit->1st token warm/cold ms: {med(rows, 'warm_engine'):.0f}/"
                     f"{med(rows, 'cold_engine'):.0f}; prompt tokens {rows[0]['prompt_tokens']}"
                     + (f"; raw cached tokens {med(rows, 'raw_cached'):.0f}" if "raw_cached" in rows[0] else "")
                     + (f"; history extends turn 1 token for token in {sum(x['extends'] for x in rows)}/"
                        f"{len(rows)} rounds" if case == "exact" else ""))
        floors = [x for x in rows if x.get("raw_floor", float("nan")) == x.get("raw_floor")]
        if floors:
            lines.append(f"{'':34} raw one-pass floor (fetch, one forward over the rest, sample) ms: "
                         f"{med(floors, 'raw_floor'):.0f} = {ratio(floors, 'raw_floor', 'raw_cold')} of raw cold; "
                         f"ours warm / floor {ratio(floors, 'warm', 'raw_floor')}")
        if case == "restart":
            lines.append(f"{'':34} start-up s with/without disk tier: {med(rows, 'startup_s'):.2f}/"
                         f"{med(rows, 'startup_off_s'):.2f} = {ratio(rows, 'startup_s', 'startup_off_s')}; "
                         f"LoadModel s {med(rows, 'load_s'):.2f}/{med(rows, 'load_off_s'):.2f} = "
                         f"{ratio(rows, 'load_s', 'load_off_s')} (target <= 1.10x); "
                         f"files in the folder: {max(x['cache_files'] for x in rows)}")
    return "\n".join(lines)


SCENARIOS = ("hybrid", "restart", "plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario (default 3: ~8 min here)")
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="run only these scenarios")
    parser.add_argument("--out", default=os.path.join(REPO, "bench-results-prefix.json"))
    parser.add_argument("--log", default=os.path.join(REPO, "bench-server.log"))
    parser.add_argument("--raw-child", nargs="?", const="", help=argparse.SUPPRESS)
    parser.add_argument("--cast", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.raw_child is not None:
        raw_child(rest[0] if rest else args.raw_child, args.cast)
        return

    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()  # the bench process builds the models with the server's BLAS
    import family_models
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    wanted = args.only or list(SCENARIOS)
    began = time.monotonic()
    nonces = iter(f"{a} {b} {random.randrange(10**6)}" for b in NONCES for a in NONCES * 50)
    smollm = str(gguf_to_mlx_dir(embedded_default()))  # loaded as a folder: no conversion in LoadModel
    results = {}
    with open(args.log, "ab") as log:
        if "hybrid" in wanted:
            for family in BENCH_SIZES:
                model_dir = family_models.build(family, sizes=BENCH_SIZES[family])
                out = chat_bench(family, model_dir, False, ("exact", "edited"), 37, args.rounds, args.log, log,
                                 nonces, word_bias(model_dir))
                results.update({(family, c): rows for c, rows in out.items()})
        if "plain" in wanted:
            out = chat_bench("smollm2", smollm, True, ("question",), 16, args.rounds, args.log, log, nonces)
            results[("smollm2", "question")] = out["question"]
        if "restart" in wanted:
            results[("smollm2", "restart")] = restart_bench(smollm, args.rounds, args.log, log, nonces)["restart"]
    print(table(results))
    took = time.monotonic() - began
    print(f"\n{args.rounds} rounds, {took / 60:.1f} min; figures written to {args.out}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"rounds": args.rounds, "seconds": took,
                   "results": {f"{n} {c}": rows for (n, c), rows in results.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
