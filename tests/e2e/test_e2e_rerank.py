"""End-to-end: Rerank with a cross-encoder (BERT sequence classification, one label).

The checkpoints are tiny random-weight BERT, XLM-R and ModernBERT classifiers
built by rerank_fixture (BERT's pairs carry token_type_ids, the others' none;
ModernBERT mean-pools over the real tokens). The oracle
is mlx-vlm's own reranker: its loader and its scoring of the same checkpoint,
run here in the test process.
"""

import json

import grpc
import pytest

from common.launcher import backend_pb2
from conftest import run_threads, serving
from rerank_fixture import tiny_cross_encoder

pytestmark = pytest.mark.e2e

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Bananas are rich in potassium.",
    "The match ended in a draw after extra time and a long penalty shoot-out.",
    "France's capital hosts the Louvre.",
    "Rain.",
    "Photosynthesis turns sunlight into chemical energy in the leaves of plants.",
]


@pytest.fixture(scope="module", params=["bert", "xlm-roberta", "modernbert"])
def model_type(request):
    return request.param


@pytest.fixture(scope="module")
def cross(log_dir, model_type):
    # Small forward chunks: a call's pairs take several passes, and concurrent calls share them.
    yield from serving(log_dir / f"rerank-{model_type}.log", tiny_cross_encoder(model_type),
                       Options=["forward_chunk_tokens:64"])


@pytest.fixture(scope="module")
def oracle(model_type):
    """scores(query, documents) -> (mlx-vlm's relevance scores, its prompt token count)."""
    from mlx_vlm.reranker_loader import load_reranker
    from mlx_vlm.server.reranking import RerankItem, score_documents
    from mlx_vlm.utils import load_config

    path = tiny_cross_encoder(model_type)
    model, processor = load_reranker(path)
    config = load_config(path)

    def scores(query, documents):
        return score_documents(model, processor, config, RerankItem(text=query),
                               [RerankItem(text=d) for d in documents], None)

    return scores


def rerank(stub, query=QUERY, documents=DOCUMENTS, **fields):
    return stub.Rerank(backend_pb2.RerankRequest(query=query, documents=documents, **fields), timeout=60)


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def by_index(reply):
    return {r.index: r.relevance_score for r in reply.results}


def test_scores_and_order_equal_mlx_vlms_reranker(cross, oracle):
    expected, tokens = oracle(QUERY, DOCUMENTS)
    assert max(expected) - min(expected) > 0.05  # the fixture's scores differ enough to order
    reply = rerank(cross.stub)
    assert sorted(by_index(reply)) == list(range(len(DOCUMENTS)))
    for i, score in by_index(reply).items():
        assert abs(score - expected[i]) < 1e-5, (i, score, expected[i])
    assert [r.index for r in reply.results] == sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert all(r.text == DOCUMENTS[r.index] for r in reply.results)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens


def test_top_n(cross, oracle):
    expected, _ = oracle(QUERY, DOCUMENTS)
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    reply = rerank(cross.stub, top_n=2)
    assert [r.index for r in reply.results] == best[:2]
    assert [r.text for r in reply.results] == [DOCUMENTS[i] for i in best[:2]]
    assert len(rerank(cross.stub, top_n=100).results) == len(DOCUMENTS)


def test_concurrent_calls_each_equal_alone(cross):
    queries = [QUERY, "Which fruit has potassium?", "Tell me about plants and sunlight."]
    alone = [by_index(rerank(cross.stub, q)) for q in queries]
    together = run_threads([lambda q=q: rerank(cross.stub, q) for q in queries])
    for a, t in zip(alone, together):
        assert not isinstance(t, grpc.RpcError), t
        got = by_index(t)
        assert got.keys() == a.keys()
        assert all(abs(got[i] - a[i]) < 1e-5 for i in a)


def test_other_requests_refused_and_serving_goes_on(cross, model_type):
    stub = cross.stub
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    opts = backend_pb2.PredictOptions
    for call in (lambda: stub.Embedding(opts(Embeddings="hello"), timeout=30),
                 lambda: stub.Score(backend_pb2.ScoreRequest(prompt="a", candidates=["b"]), timeout=30),
                 lambda: stub.Predict(opts(Prompt="Hello"), timeout=30),
                 lambda: list(stub.PredictStream(opts(Prompt="Hello"), timeout=30))):
        code, details = code_of(call)
        assert code == INVALID and "cross-encoder" in details, details
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_cross_encoder(model_type))
    reply = stub.TokenizeString(opts(Prompt="Paris is lovely"), timeout=30)
    assert list(reply.tokens) == tok("Paris is lovely")["input_ids"]
    meta = stub.ModelMetadata(backend_pb2.ModelOptions(), timeout=30)  # no chat format to report
    assert not meta.supports_thinking and not meta.rendered_template
    assert len(rerank(stub).results) == len(DOCUMENTS)


def test_bad_input(cross):
    stub = cross.stub
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: rerank(stub, documents=[]))[0] == INVALID
    assert code_of(lambda: rerank(stub, query=""))[0] == INVALID
    code, details = code_of(lambda: rerank(stub, documents=["fine", ""]))
    assert code == INVALID and "documents[1]" in details
    assert code_of(lambda: rerank(stub, documents=["d"] * 300))[0] == INVALID
    assert code_of(lambda: rerank(stub, top_n=-1))[0] == INVALID
    # The fixture reads 128 positions: a pair longer than that is refused, not cut.
    code, details = code_of(lambda: rerank(stub, documents=["short", "word " * 200]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "documents[1]" in details and "128" in details
    code, details = code_of(lambda: rerank(stub, ModelIdentity="another-model"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert len(rerank(stub).results) == len(DOCUMENTS)


def test_classifiers_that_are_no_cross_encoder_are_refused(cross, model_type, tmp_path):
    result = cross.load(tiny_cross_encoder(model_type, num_labels=2))
    assert not result.success and "exactly one output label" in result.message, result.message
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForSequenceClassification"], "num_labels": 1}))
    result = cross.load(str(tmp_path))
    assert not result.success and "'llama' sequence classifier is not served" in result.message, result.message
    assert len(rerank(cross.stub).results) == len(DOCUMENTS)  # the loaded model still serves
