#!/usr/bin/env python3
"""`make bench-embed`: Embedding and Score against the raw libraries, like for like, same run.

  (a) Embedding throughput, sentences/s: 32 short sentences sent as 32
      concurrent Embedding calls to our server (all-MiniLM-L6-v2), vs
      mlx-embeddings called directly on the same 32 sentences as one batch
      (its tokenizer with padding, its model, its pooled `text_embeds`).
      On the CPU our server computes GELU from multiply-adds (backend/loaders/fast_gelu.py);
      (a') repeats (a) with that off, to show what serving alone costs.
  (b) Score of 8 candidates after a ~300-token prompt: our Score call vs one
      direct mlx-lm prefill of the prompt plus one batched pass of the 8
      candidates continuing its KV (SmolLM2, the same converted GGUF and dtype).
  (c) Health p50/p99 while 4 chat streams decode, alone and with Embedding and
      Score calls arriving meanwhile (ours only: forward work runs between decode
      steps in bounded chunks, so Health should barely move).

Like for like: this process preloads OpenBLAS as the server does (it re-execs
itself once), the raw side runs here while the server is idle and the other
way round, the rounds alternate which side goes first, and every Score
prompt starts with words no earlier prompt had, so no prefix cache helps.
A ratio is ours / raw time (lower is better) as the median over rounds.
"""

import argparse
import os
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, os.path.join(REPO, "tests")]

SENTENCES = [f"Sentence {i}: the {w} walked to the market to buy some {f}." for i, (w, f) in enumerate(
    (w, f) for w in ("farmer", "teacher", "child", "doctor") for f in
    ("bread", "apples", "fish", "rice", "tea", "milk", "eggs", "cheese"))]
CANDIDATES = [" yes", " no", " maybe later", " the archive", " a shipment of tea", " port 7", " crates", " none"]


def notes(r: int) -> str:
    """About 300 tokens, different in every round."""
    return f"Round {r} ledger. " + " ".join(
        f"Entry {i}: {i * 7 + r} crates of tea went to port {(i + r) % 13}." for i in range(1, 19)) + \
        " Question: what did the ledger record? Answer:"


def ours_embed(stub, pb) -> float:
    # Futures, not 32 client threads: a host sends concurrent calls without a Python thread each.
    t = time.perf_counter()
    calls = [stub.Embedding.future(pb.PredictOptions(Embeddings=s), timeout=120) for s in SENTENCES]
    results = [c.result() for c in calls]
    elapsed = time.perf_counter() - t
    assert all(r.dim > 0 for r in results)
    return elapsed


def raw_embed(model, tok) -> float:
    import mlx.core as mx

    t = time.perf_counter()
    enc = tok(SENTENCES, padding=True, return_tensors="np")
    out = model(mx.array(enc["input_ids"]), attention_mask=mx.array(enc["attention_mask"]))
    mx.eval(out.text_embeds)
    out.text_embeds.tolist()
    return time.perf_counter() - t


def ours_score(stub, pb, prompt) -> float:
    t = time.perf_counter()
    reply = stub.Score(pb.ScoreRequest(prompt=prompt, candidates=CANDIDATES), timeout=300)
    assert len(reply.candidates) == len(CANDIDATES)
    return time.perf_counter() - t


def raw_score(lm, prompt) -> float:
    """One direct prefill, then the candidates as one right-padded batch over the repeated KV."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    tok = lm.tokenizer
    t = time.perf_counter()
    p = tok.encode(prompt)
    rows = [tok.encode(prompt + c)[len(p) - 1:] for c in CANDIDATES]
    cache = make_prompt_cache(lm.model)
    lm.model(mx.array([p[:-1]]), cache=cache)
    mx.eval([c.state for c in cache])
    batched = []
    for c in cache:
        b = KVCache()
        b.state = (mx.repeat(c.keys[..., :c.offset, :], len(rows), axis=0),
                   mx.repeat(c.values[..., :c.offset, :], len(rows), axis=0), c.offset)
        batched.append(b)
    width = max(len(r) for r in rows)
    logits = lm.model(mx.array([r[:-1] + [0] * (width - len(r) + 1) for r in rows]), cache=batched)
    logprobs = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
    mx.eval(logprobs)
    return time.perf_counter() - t


def health_during_streams(stub, pb, with_forward: bool):
    """Health latencies (ms) while 4 streams decode, optionally with forward work arriving."""
    from common.launcher import chat

    lat, stop = [], threading.Event()

    def stream(i):
        opts = chat(f"Write a long story about crate number {i}.", Tokens=48, IgnoreEOS=True)
        for _ in stub.PredictStream(opts, timeout=600):
            pass

    def forward_traffic():
        i = 0
        while not stop.is_set():
            stub.Embedding(pb.PredictOptions(Embeddings=f"sentence {i} about tea"), timeout=120)
            stub.Score(pb.ScoreRequest(prompt=notes(100 + i)[:400], candidates=CANDIDATES[:4]), timeout=300)
            i += 1

    streams = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    extra = [threading.Thread(target=forward_traffic)] if with_forward else []
    for t in streams + extra:
        t.start()
    while any(t.is_alive() for t in streams):
        t0 = time.perf_counter()
        stub.Health(pb.HealthMessage(), timeout=10)
        lat.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.02)
    stop.set()
    for t in extra:
        t.join()
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


SETTLE_S = 0.5  # between the two sides: BLAS threads of the side that just ran stop spinning


def paired(r, ours, raw):
    """(ours, raw) seconds, the side going first alternating with the round."""
    if r % 2:
        b = raw()
        time.sleep(SETTLE_S)
        a = ours()
    else:
        a = ours()
        time.sleep(SETTLE_S)
        b = raw()
    time.sleep(SETTLE_S)
    return a, b


def report(name, pairs, unit_fn, unit):
    ratios = [a / b for a, b in pairs]
    ours = statistics.median(unit_fn(a) for a, _ in pairs)
    raw = statistics.median(unit_fn(b) for _, b in pairs)
    print(f"{name}: ours {ours:.1f} {unit}, raw {raw:.1f} {unit}; time ratio ours/raw median "
          f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}..{max(ratios):.2f}] over {len(pairs)} rounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log", default=os.path.join(REPO, "bench-embed-server.log"))
    args = parser.parse_args()

    from common.launcher import Backend, backend_pb2 as pb
    from loaders import model_loader
    from models import minilm_dir

    # (a) embeddings
    from mlx_embeddings.utils import load_model
    from transformers import AutoTokenizer
    from pathlib import Path

    model, tok = load_model(Path(minilm_dir())), AutoTokenizer.from_pretrained(minilm_dir())
    for options, name in (([], "(a) Embedding, 32 sentences"),
                          (["fast_gelu:false"], "(a') the same, our GELU off (serving overhead alone)")):
        with Backend(log_path=args.log) as b:
            assert b.load(minilm_dir(), Options=options).success
            ours_embed(b.stub, pb), raw_embed(model, tok)  # warm both
            pairs = [paired(r, lambda: ours_embed(b.stub, pb), lambda: raw_embed(model, tok))
                     for r in range(args.rounds)]
        report(name, pairs, lambda s: len(SENTENCES) / s, "sentences/s")

    # (b) scores
    lm = model_loader.load(model_loader.LoadSpec(model=model_loader.embedded_default(), dtype="float32"))
    with Backend(log_path=args.log) as b:
        assert b.load(model_loader.embedded_default(), DType="float32").success
        ours_score(b.stub, pb, notes(-1)), raw_score(lm, notes(-2))  # warm both
        pairs = []
        for r in range(args.rounds):
            pairs.append(paired(r, lambda: ours_score(b.stub, pb, notes(2 * r)),
                                lambda: raw_score(lm, notes(2 * r + 1))))
        alone = health_during_streams(b.stub, pb, False)
        mixed = health_during_streams(b.stub, pb, True)
    n = len(lm.tokenizer.encode(notes(0)))
    report(f"(b) Score, 8 candidates after {n} tokens", pairs, lambda s: s * 1000, "ms")
    print(f"(c) Health p50 / p99 ms while 4 streams decode: alone {alone[0]:.1f} / {alone[1]:.1f}, "
          f"with Embedding and Score calls arriving {mixed[0]:.1f} / {mixed[1]:.1f}")


if __name__ == "__main__":
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()
    main()
