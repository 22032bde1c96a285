"""End-to-end: Embedding, Score and Rerank against the real server with real models.

Oracles are independent of the code under test: a numpy BERT forward pass
written here from the safetensors (embeddings), one direct mlx-lm forward
pass over prompt+candidate with a log-softmax done here (scores).
"""

import json
import math
import threading
import time

import grpc
import numpy as np
import pytest

from common.launcher import Backend, backend_pb2, chat
from conftest import run_threads, serving
from models import minilm_dir

pytestmark = pytest.mark.e2e

SENTENCES = [
    "A man is playing a guitar on the stage.",
    "The cat sleeps on the warm windowsill.",
    "Stock markets fell sharply after the announcement.",
    "How do I bake bread at home?",
    "Photosynthesis turns sunlight into chemical energy.",
]


def embed(stub, text, **fields):
    return stub.Embedding(backend_pb2.PredictOptions(Embeddings=text, **fields), timeout=60)


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


# ---- a numpy BERT, written from the architecture, as the embedding oracle ---------------


def _layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def numpy_sentence_embedding(weights, config, ids):
    """Mean of the last hidden states, L2-normalised (the model's sentence-transformers recipe)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    n, heads = len(ids), config["num_attention_heads"]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(name, h):
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def split(h):
            return h.reshape(n, heads, -1).transpose(1, 0, 2)

        q, k, v = (split(lin(f"attention.self.{m}", x)) for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(1, 0, 2).reshape(n, -1)
        x = _layer_norm(x + lin("attention.output.dense", ctx),
                        w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        h = lin("output.dense", _gelu(lin("intermediate.dense", x)))
        x = _layer_norm(x + h, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    v = x.mean(0)
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def minilm(log_dir):
    # Small forward chunks: concurrent calls share batches of a few inputs, and a Rerank's
    # inputs take several chunks.
    yield from serving(log_dir / "embed-minilm.log", minilm_dir(), Options=["forward_chunk_tokens:32"])


@pytest.fixture(scope="module")
def reference_bert():
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    d = minilm_dir()
    config = json.load(open(f"{d}/config.json"))
    return load_file(f"{d}/model.safetensors"), config, AutoTokenizer.from_pretrained(d)


def test_encoder_embeddings_match_a_numpy_bert(minilm, reference_bert):
    weights, config, tok = reference_bert
    # Concurrent calls: they are padded into shared batches, which must not change a vector.
    replies = run_threads([lambda s=s: embed(minilm.stub, s) for s in SENTENCES])
    for sentence, reply in zip(SENTENCES, replies):
        ids = tok(sentence)["input_ids"]
        assert (reply.tokens, reply.dim, reply.prompt_tokens) == (1, 384, len(ids))
        assert reply.layout == backend_pb2.EmbeddingLayout.EMBEDDING_LAYOUT_FINAL
        ref = numpy_sentence_embedding(weights, config, ids)
        assert cosine(reply.embeddings, ref) >= 0.999999, sentence  # float32 both: ~1 - 1e-12 seen
        assert abs(np.linalg.norm(reply.embeddings) - 1.0) < 1e-4  # the model's Normalize module


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(minilm):
    base, para, other = (np.array(embed(minilm.stub, s).embeddings) for s in (
        "A man is playing a guitar.", "Someone plays the guitar.", "The stock market crashed today."))
    assert cosine(base, para) > cosine(base, other) + 0.2


def test_embedding_tokens_and_text_agree(minilm, reference_bert):
    tok = reference_bert[2]
    ids = tok(SENTENCES[0])["input_ids"]
    by_ids = minilm.stub.Embedding(backend_pb2.PredictOptions(EmbeddingTokens=ids), timeout=60)
    assert cosine(by_ids.embeddings, embed(minilm.stub, SENTENCES[0]).embeddings) > 0.99999


def test_rerank_with_the_embedding_model(minilm):
    docs = ["Bananas are rich in potassium.", "Paris is the capital and largest city of France.",
            "The match ended in a draw.", "France's capital hosts the Louvre museum."]
    reply = minilm.stub.Rerank(backend_pb2.RerankRequest(
        query="What is the capital of France?", documents=docs, top_n=3), timeout=60)
    assert len(reply.results) == 3
    assert reply.results[0].index == 1
    assert all(r.text == docs[r.index] for r in reply.results)
    scores = [r.relevance_score for r in reply.results]
    assert scores == sorted(scores, reverse=True)
    q = embed(minilm.stub, "What is the capital of France?").embeddings
    for r in reply.results:  # cosine of the two embeddings
        assert abs(r.relevance_score - cosine(q, embed(minilm.stub, docs[r.index]).embeddings)) < 1e-4
    assert reply.usage.prompt_tokens > 0
    everything = minilm.stub.Rerank(backend_pb2.RerankRequest(query="capital", documents=docs), timeout=60)
    assert sorted(r.index for r in everything.results) == [0, 1, 2, 3]


def test_bad_input_to_the_embedding_model(minilm):
    stub = minilm.stub
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: embed(stub, ""))[0] == INVALID
    code, details = code_of(lambda: embed(stub, "word " * 300))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "256" in details
    code, details = code_of(lambda: embed(stub, "hi", ModelIdentity="another-model"))
    assert code == grpc.StatusCode.NOT_FOUND and "model identity mismatch" in details
    assert code_of(lambda: stub.Embedding(backend_pb2.PredictOptions(EmbeddingTokens=[10 ** 6]), timeout=30))[0] == INVALID
    assert code_of(lambda: stub.Predict(backend_pb2.PredictOptions(Prompt="Hello"), timeout=30))[0] == INVALID
    assert code_of(lambda: stub.Score(backend_pb2.ScoreRequest(prompt="a", candidates=["b"]), timeout=30))[0] == INVALID
    rerank = backend_pb2.RerankRequest
    assert code_of(lambda: stub.Rerank(rerank(query="q", documents=[]), timeout=30))[0] == INVALID
    assert code_of(lambda: stub.Rerank(rerank(query="", documents=["d"]), timeout=30))[0] == INVALID
    assert code_of(lambda: stub.Rerank(rerank(query="q", documents=["d"] * 300), timeout=30))[0] == INVALID
    assert code_of(lambda: stub.Rerank(rerank(query="q", documents=["d"], top_n=-1), timeout=30))[0] == INVALID
    assert embed(stub, "still serving").dim == 384


def test_no_model_loaded_then_per_token_vectors(log_dir, minilm):
    with Backend(log_path=str(log_dir / "embed-empty.log")) as b:
        for call in (lambda: embed(b.stub, "x"),
                     lambda: b.stub.Score(backend_pb2.ScoreRequest(prompt="a", candidates=["b"]), timeout=30),
                     lambda: b.stub.Rerank(backend_pb2.RerankRequest(query="q", documents=["d"]), timeout=30)):
            code, details = code_of(call)
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "model not loaded" in details
        assert b.load(minilm_dir(), Options=["embedding_pooling:none"]).success
        reply = embed(b.stub, SENTENCES[1])
        assert reply.layout == backend_pb2.EmbeddingLayout.EMBEDDING_LAYOUT_PER_TOKEN
        assert reply.tokens == reply.prompt_tokens and reply.dim == 384
        per_token = np.array(reply.embeddings).reshape(reply.tokens, reply.dim)
        # Their mean is what the model's own mean pooling gives.
        assert cosine(per_token.mean(0), embed(minilm.stub, SENTENCES[1]).embeddings) > 0.99999
        assert not b.load(minilm_dir(), Options=["embedding_pooling:max"]).success


# ---- a causal LM: embeddings from hidden states, scores from log-probs ------------------


@pytest.fixture(scope="module")
def smol(log_dir):
    from loaders.model_loader import embedded_default

    # float32 explicitly, so the in-test reference computes with the same weights; small
    # forward chunks, so that short texts already take several (a real prompt would at 128).
    yield from serving(log_dir / "embed-smol.log", embedded_default(), DType="float32",
                       Options=["forward_chunk_tokens:32"])


@pytest.fixture(scope="module")
def direct():
    """SmolLM2 in this process, float32, with its Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    from loaders import model_loader
    from loaders.gguf_loader import gguf_to_mlx_dir

    spec = model_loader.LoadSpec(model=model_loader.embedded_default(), dtype="float32")
    lm = model_loader.load(spec)
    return lm.model, AutoTokenizer.from_pretrained(str(gguf_to_mlx_dir(spec.model)))


def direct_logprobs(model, ids):
    """log P(ids[i] | ids[:i]) for i >= 1, from one forward pass over the whole sequence."""
    import mlx.core as mx

    logits = model(mx.array([ids[:-1]])).astype(mx.float32)[0]
    logits = np.array(logits, dtype=np.float64)
    top = logits.max(-1, keepdims=True)
    logsoftmax = logits - (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))
    return [float(logsoftmax[i, t]) for i, t in enumerate(ids[1:])]


def score(stub, prompt, candidates, **fields):
    return stub.Score(backend_pb2.ScoreRequest(prompt=prompt, candidates=candidates, **fields),
                      timeout=120).candidates


def test_score_equals_a_direct_forward_pass(smol, direct):
    model, tok = direct
    prompt = "The capital of France is"
    cands = [" Paris", " London", " a beautiful city on the Seine."]
    p = tok(prompt)["input_ids"]
    got = score(smol.stub, prompt, cands, include_token_logprobs=True, length_normalize=True)
    for cand, c in zip(cands, got):
        full = tok(prompt + cand)["input_ids"]
        assert full[:len(p)] == p  # no merge across the boundary for these
        ref = direct_logprobs(model, full)[len(p) - 1:]
        assert c.num_tokens == len(full) - len(p) == len(c.tokens)
        assert abs(c.log_prob - sum(ref)) < 1e-4, cand
        assert abs(c.length_normalized_log_prob - sum(ref) / len(ref)) < 1e-4
        assert [t.log_prob for t in c.tokens] == pytest.approx(ref, abs=1e-4)
        assert "".join(t.token for t in c.tokens) == cand
    assert got[0].log_prob > got[1].log_prob


def test_a_candidate_merging_with_the_prompt_is_scored_as_generated(smol, direct):
    model, tok = direct
    prompt, cand = "I like to go", "ing out"
    p, full = tok(prompt)["input_ids"], tok(prompt + cand)["input_ids"]
    assert full[:len(p) - 1] == p[:len(p) - 1] and full[len(p) - 1] != p[-1]  # " go" became " going"
    (c,) = score(smol.stub, prompt, [cand], include_token_logprobs=True)
    ref = direct_logprobs(model, full)[len(p) - 2:]  # from the merged token on
    assert c.num_tokens == len(full) - len(p) + 1
    assert abs(c.log_prob - sum(ref)) < 1e-4
    assert c.tokens[0].token.startswith(" go")


def test_eight_candidates_in_one_batch_equal_one_by_one(smol):
    prompt = "Q: Which animal says moo?\nA:"
    cands = [" a cow", " the dog", " cows", " A sheep and a goat", " moo", " cat", " horse!", " It is a cow."]
    together = [c.log_prob for c in score(smol.stub, prompt, cands)]
    alone = [score(smol.stub, prompt, [c])[0].log_prob for c in cands]
    assert together == pytest.approx(alone, abs=1e-4)


def test_stable_prefix_is_kept_warm(smol):
    head = "Context: the meeting moved to Thursday at noon in room 4. " * 3
    prompts = [head + "Question: when is the meeting? Answer:", head + "Question: where is it? Answer:"]
    cold = [score(smol.stub, p, [" Thursday", " room 4"])[0].log_prob for p in prompts]
    warm = [score(smol.stub, p, [" Thursday", " room 4"], stable_prefix_len=len(head.encode()))[0].log_prob
            for p in prompts]
    assert warm == pytest.approx(cold, abs=1e-4)
    lines = [l for l in open(smol.log_path) if "score:" in l]
    assert "(0 cached)" not in lines[-1], lines[-1]  # the second warm call reused the stable prefix


def test_causal_lm_embedding_is_its_normalised_last_hidden_state(smol, direct):
    import mlx.core as mx

    model, tok = direct
    # The long one (over the 32-token chunk) is embedded a chunk at a time, continuing its KV.
    long_text = " ".join(f"Item {i} is a {c} box." for i, c in enumerate(["red", "blue", "green"] * 3))
    for text in ("Embeddings from a chat model.", long_text):
        reply = embed(smol.stub, text)
        ids = tok(text)["input_ids"]
        h = np.array(model.model(mx.array([ids])).astype(mx.float32)[0, -1], dtype=np.float64)
        assert (reply.tokens, reply.dim, reply.prompt_tokens) == (1, h.shape[0], len(ids))
        assert cosine(reply.embeddings, h) > 0.9999
        assert abs(np.linalg.norm(reply.embeddings) - 1.0) < 1e-4
    assert len(ids) > 2 * 32


def test_bad_score_input(smol):
    stub, INVALID = smol.stub, grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: score(stub, "a prompt", []))[0] == INVALID
    assert code_of(lambda: score(stub, "", ["x"]))[0] == INVALID
    assert code_of(lambda: score(stub, "a prompt", [" x", ""]))[0] == INVALID
    assert code_of(lambda: score(stub, "a prompt", ["x"] * 300))[0] == INVALID
    assert code_of(lambda: score(stub, "abc", ["x"], stable_prefix_len=10))[0] == INVALID
    assert code_of(lambda: score(stub, "word " * 9000, [" x"]))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, details = code_of(lambda: score(stub, "a", ["b"], ModelIdentity="other"))
    assert code == grpc.StatusCode.NOT_FOUND and "model identity mismatch" in details
    assert len(score(stub, "still", [" serving"])) == 1


def test_a_score_whose_caller_left_stops_running(smol):
    prompt = " ".join(f"Entry {i}: {i * 3} crates." for i in range(250))  # ~2000 tokens: many chunks
    with pytest.raises(grpc.RpcError) as e:
        smol.stub.Score(backend_pb2.ScoreRequest(prompt=prompt, candidates=[" yes"]), timeout=1.0)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 60
    while "ScoreJob dropped: its caller went away" not in open(smol.log_path).read():
        assert time.monotonic() < deadline, "the abandoned score job kept running"
        time.sleep(0.2)
    assert len(score(smol.stub, "still", [" serving"])) == 1


def test_embeddings_and_scores_complete_while_four_streams_decode(smol):
    stub = smol.stub
    streams = [chat(q, Tokens=40, IgnoreEOS=True) for q in (
        "Tell me about rivers.", "Describe a cat.", "Name some colours.", "Write about rain.")]
    health, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t = time.perf_counter()
            assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
            health.append((time.perf_counter() - t) * 1000)
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        calls = [lambda o=o: b"".join(c.message for c in stub.PredictStream(o, timeout=300)) for o in streams]
        calls += [lambda i=i: embed(stub, f"sentence number {i}") for i in range(4)]
        calls += [lambda i=i: score(stub, f"Count: {i},", [" one", " two"]) for i in range(3)]
        results = run_threads(calls)
    finally:
        stop.set()
        prober.join()
    assert not [r for r in results if isinstance(r, grpc.RpcError)], results
    assert all(len(r) > 0 for r in results[:4])
    assert all(r.dim == 576 for r in results[4:8])
    assert all(len(r) == 2 for r in results[8:])
    assert health  # Health kept answering throughout (its latencies are measured by the bench)
