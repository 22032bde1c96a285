#!/usr/bin/env python3
"""`make bench-adapt`: quantized KV cache and LoRA adapters, ours against raw mlx-lm in the same run.

  KV cache (float / q8 / q4), embedded SmolLM2:
    bytes per cached token (Status, measured at load) and prefix-cache bytes
    per token held after the streams; single-stream decode tok/s vs raw
    mlx_lm.stream_generate with the same kv_bits (quantized_kv_start 0);
    4-stream aggregate tok/s vs raw mlx_lm.batch_generate (float: mlx-lm has
    no batched quantized cache, so the quantized rows compare with its float batch).
  LoRA: one random rank-8 adapter on every q/v projection; single-stream
    decode tok/s vs raw mlx-lm loaded with adapter_path (LoRALinear layers).

Like for like: raw mlx-lm runs in this process on the same converted GGUF
with the same dtype choice (OpenBLAS preloaded on both sides) while the
server idles; greedy; the same token ids on both sides; one side at a time.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO]

PROMPTS = [
    "The history of France is long and eventful. It begins",
    "A steam engine works by heating water in a boiler until",
    "The water cycle has four stages. The first stage is",
    "Chess is played on a board of sixty-four squares. Each player",
]


def raw_model(adapter=None):
    import mlx.core as mx
    from mlx_lm import load

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import _cast, _choose_dtype, embedded_default

    model, tok = load(str(gguf_to_mlx_dir(embedded_default())))
    dtype = _choose_dtype("auto", model)
    if dtype:
        _cast(model, dtype)
    if adapter:
        from mlx_lm.tuner.utils import load_adapters

        load_adapters(model, adapter)
    mx.eval(model.parameters())
    return model, tok


def raw_decode(model, ids, n, kv_bits=None):
    """Decode tok/s of mlx_lm.stream_generate, and its token ids."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    out, t_first = [], None
    for r in stream_generate(model, _Tok.tok, ids, max_tokens=n, sampler=make_sampler(0.0),
                             kv_bits=kv_bits, kv_group_size=64, quantized_kv_start=0):
        out.append(r.token)
        if t_first is None:
            t_first = time.perf_counter()
    return (len(out) - 1) / (time.perf_counter() - t_first), out


def raw_batch(model, prompts, n):
    from mlx_lm import batch_generate

    started = time.perf_counter()
    r = batch_generate(model, _Tok.tok, prompts, max_tokens=n, return_token_ids=True)
    return sum(map(len, r.token_ids)) / (time.perf_counter() - started)


class _Tok:
    tok = None


def ours_decode(stub, pb, text, n):
    marks = []
    for reply in stub.PredictStream(pb.PredictOptions(Prompt=text, Tokens=n, IgnoreEOS=True), timeout=600):
        marks.append((time.perf_counter(), reply.tokens))
    (t0, k0), (t1, k1) = marks[0], marks[-1]
    return (k1 - k0) / (t1 - t0)


def ours_batch(stub, pb, texts, n):
    done = []

    def one(t):
        r = stub.Predict(pb.PredictOptions(Prompt=t, Tokens=n, IgnoreEOS=True), timeout=600)
        done.append(r.tokens)

    threads = [threading.Thread(target=one, args=(t,)) for t in texts]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - started)


def make_adapter(path, rank=8):
    import mlx.core as mx
    import numpy as np
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    cfg = json.loads((gguf_to_mlx_dir(embedded_default()) / "config.json").read_text())
    hidden, kv = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["hidden_size"] // cfg["num_attention_heads"]
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for name, out in (("q_proj", hidden), ("v_proj", kv)):
            stem = f"model.layers.{i}.self_attn.{name}"
            tensors[f"{stem}.lora_a"] = mx.array(rng.uniform(-1, 1, (hidden, rank)).astype("float32") / hidden ** 0.5)
            tensors[f"{stem}.lora_b"] = mx.array(rng.normal(0, 0.02, (rank, out)).astype("float32"))
    os.makedirs(path)
    mx.save_safetensors(os.path.join(path, "adapters.safetensors"), tensors)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"fine_tune_type": "lora", "num_layers": cfg["num_hidden_layers"],
                   "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0,
                                       "keys": ["self_attn.q_proj", "self_attn.v_proj"]}}, f)


def main() -> None:
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    n = args.tokens

    import backend_pb2 as pb
    from common.launcher import Backend
    from loaders.model_loader import embedded_default

    model_path = embedded_default()
    rows = []
    with Backend(log_path=os.path.join(tempfile.gettempdir(), "bench_adapt.log")) as server:
        stub = server.stub
        raw, _Tok.tok = raw_model()
        for name, fields, bits in (("float", {}, None), ("q8_0", dict(CacheTypeKey="q8_0"), 8),
                                   ("q4_0", dict(CacheTypeKey="q4_0"), 4)):
            assert server.load(model_path, **fields).success
            ids = [list(stub.TokenizeString(pb.PredictOptions(Prompt=p)).tokens) for p in PROMPTS]
            mem = dict(stub.Status(pb.HealthMessage()).memory.breakdown)
            ours1 = ours_decode(stub, pb, PROMPTS[0], n)
            raw1, _ = raw_decode(raw, ids[0], n, bits)
            ours4 = ours_batch(stub, pb, PROMPTS, n)
            raw4 = raw_batch(raw, ids, n)
            time.sleep(1.0)  # the engine refreshes Status between steps
            after = dict(stub.Status(pb.HealthMessage()).memory.breakdown)
            held = 4 * n + sum(map(len, ids)) + n  # the batch's entries and the single stream's
            rows.append((name, mem["kv_bytes_per_token"], mem["kv_bytes_per_token_float"],
                         after["prompt_cache"] / held, ours1, raw1, ours4, raw4))
        with tempfile.TemporaryDirectory() as tmp:
            adapter = os.path.join(tmp, "adapter")
            make_adapter(adapter)
            assert server.load(model_path, LoraAdapter=adapter).success
            ours_lora = ours_decode(stub, pb, PROMPTS[0], n)
            del raw
            lora_model, _ = raw_model(adapter)
            raw_lora, _ = raw_decode(lora_model, ids[0], n)

    print(f"KV cache, SmolLM2-135M, {n} tokens a stream")
    print(f"{'cache':6} {'B/token':>8} {'vs float':>8} {'prefix B/token':>14} "
          f"{'1 stream ours/raw tok/s':>24} {'4 streams ours/raw(float) tok/s':>32}")
    for name, b, fb, pc, o1, r1, o4, r4 in rows:
        print(f"{name:6} {b:8d} {fb / b:7.2f}x {pc:14.0f} {o1:8.1f}/{r1:6.1f} = {o1 / r1:4.2f}x "
              f"{o4:14.1f}/{r4:6.1f} = {o4 / r4:4.2f}x")
    print(f"LoRA rank 8 on q/v of 30 layers, 1 stream: ours (fused) {ours_lora:.1f} tok/s, "
          f"raw mlx-lm (LoRALinear) {raw_lora:.1f} tok/s = {ours_lora / raw_lora:.2f}x")


if __name__ == "__main__":
    main()
