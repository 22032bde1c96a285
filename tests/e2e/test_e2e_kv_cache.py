"""End to end: a quantized (or float16) KV cache through the real server.

The float reference is the shared server (the model's own cache); a second
server loads the same embedded SmolLM2 with CacheTypeKey/Value. Both run the
prompts as one concurrent batch, so the quantized cache is exercised by
continuous batching, not one request at a time.
"""

import json
import time

import pytest

import backend_pb2
from common.launcher import chat
from conftest import run_threads, serving

pytestmark = pytest.mark.e2e

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is the largest planet in the solar system?",
    "What is 12 plus 7?",
]
TOKENS = 40


@pytest.fixture(scope="module")
def q8(log_dir):
    from loaders.model_loader import embedded_default

    yield from serving(log_dir / "kv_q8.log", embedded_default(), CacheTypeKey="q8_0", CacheTypeValue="q8_0")


def greedy(stub):
    """Token ids and prompt sizes of PROMPTS decoded greedily, all at once."""
    replies = run_threads([lambda q=q: stub.Predict(chat(q, Tokens=TOKENS, Logprobs=1), timeout=600)
                           for q in PROMPTS])
    for r in replies:
        assert isinstance(r, backend_pb2.Reply), r
    return [ids_of(r) for r in replies], [r.prompt_tokens for r in replies]


def ids_of(reply):
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def forced_agreement(stub, question, ref, got):
    """(same, counted): how many of the float cache's greedy tokens the cache under test also picks
    after the same text.

    `got` is its free-running greedy output; after each first difference the text is
    put back on the float path (the float tokens so far as a raw prompt, checked to
    tokenize to the same ids) and decoding goes on from there, so one near-tie does
    not count every later token as different.
    """
    head = list(stub.TokenizeString(chat(question), timeout=60).tokens)
    i = same = counted = 0
    while True:
        n = prefix(got, ref[i:])
        same, counted, i = same + n, counted + n, i + n
        if i >= len(ref):  # the float run ended here: by EOS if it is short, else by max tokens
            counted += int(len(ref) < TOKENS and len(got) > n)
            return same, counted
        counted, i = counted + 1, i + 1  # the differing token
        while i < len(ref):
            text = stub.Detokenize(backend_pb2.DetokenizeRequest(tokens=head + ref[:i]), timeout=60).content
            if list(stub.TokenizeString(backend_pb2.PredictOptions(Prompt=text), timeout=60).tokens) == head + ref[:i]:
                break
            i += 1  # this cut does not tokenize back: not counted
        if i >= len(ref):
            return same, counted
        got = ids_of(stub.Predict(backend_pb2.PredictOptions(Prompt=text, Tokens=len(ref) - i, Logprobs=1),
                                  timeout=600))


def memory(stub, settled=lambda m: True, timeout=5.0):
    """Status's breakdown, polled until `settled` (the engine refreshes it between steps)."""
    deadline = time.monotonic() + timeout
    while True:
        m = dict(stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown)
        if settled(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def expected_bytes_per_token(float_bytes: int, bits: int, group: int = 64) -> int:
    """The size from the model's shape: `bits` per value, plus a scale and a bias per group when quantized."""
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    cfg = json.loads((gguf_to_mlx_dir(embedded_default()) / "config.json").read_text())
    layers, heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rows = layers * 2 * heads  # keys and values
    itemsize = float_bytes // (rows * dim)  # of the float cache: the scales' type too
    if bits >= 16:
        return rows * dim * bits // 8
    return rows * (dim * bits // 8 + 2 * (dim // group) * itemsize)


def test_q8_cache_keeps_the_float_text_in_a_batch_and_stores_compact_prefixes(server, q8):
    ref, _ = greedy(server.stub)
    got, prompt_tokens = greedy(q8.stub)
    float_bytes = memory(server.stub)["kv_bytes_per_token"]
    held = sum(p + len(c) for p, c in zip(prompt_tokens, got))
    m = memory(q8.stub, lambda m: m["prompt_cache"] > 0)
    assert m["kv_bytes_per_token_float"] == float_bytes
    assert m["kv_bytes_per_token"] == expected_bytes_per_token(float_bytes, 8)
    assert float_bytes / m["kv_bytes_per_token"] >= 1.8
    # The prefix cache keeps the finished requests in the quantized form.
    assert 0 < m["prompt_cache"] <= held * m["kv_bytes_per_token"] * 1.1

    free = sum(prefix(a, b) for a, b in zip(ref, got)) / sum(map(len, ref))
    counts = [forced_agreement(q8.stub, q, a, b) for q, a, b in zip(PROMPTS, ref, got)]
    share = sum(c[0] for c in counts) / sum(c[1] for c in counts)
    print(f"q8 KV cache: {share:.1%} of the float cache's greedy tokens, {free:.1%} before a first difference")
    assert share >= 0.95, f"q8 KV cache matched {share:.1%} of the float cache's greedy tokens"


def test_q4_and_f16_caches_and_refused_cache_options(q8):
    from loaders.model_loader import embedded_default

    stub, model = q8.stub, embedded_default()
    float_bytes = memory(stub)["kv_bytes_per_token_float"]
    question = chat(PROMPTS[0], Tokens=8)

    bad = q8.load(model, CacheTypeKey="q3_x")
    assert not bad.success and "CacheTypeKey" in bad.message and "q3_x" in bad.message
    # A group size the model's head dimension cannot hold is found at load, not per request.
    bad = q8.load(model, Options=["kv_bits:4", "kv_group_size:128"])
    assert not bad.success and "does not work with this model" in bad.message, bad.message
    assert memory(stub)["kv_bytes_per_token"] == expected_bytes_per_token(float_bytes, 8)  # q8 still serves
    assert stub.Predict(question, timeout=120).tokens > 0

    assert q8.load(model, CacheTypeKey="q4_0", CacheTypeValue="q4_0").success
    q4 = memory(stub)["kv_bytes_per_token"]
    assert q4 == expected_bytes_per_token(float_bytes, 4)
    assert float_bytes / q4 >= 3.2
    assert stub.Predict(question, timeout=120).tokens > 0

    assert q8.load(model, CacheTypeKey="f16", CacheTypeValue="f16").success
    assert memory(stub)["kv_bytes_per_token"] == expected_bytes_per_token(float_bytes, 16)
    assert b"Paris" in stub.Predict(question, timeout=120).message
    # The fixture is shared by the module's tests, in whatever order they run: as it came.
    assert q8.load(model, CacheTypeKey="q8_0", CacheTypeValue="q8_0").success
