"""The request spec, Rerank's ranking and the servicer's refusals by what a model serves
(pure logic: no MLX model, no server)."""

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest

import backend_pb2 as pb
from common.python_utils import OptionError
import load_options
from loaders.loaded import SERVES
import prepare
from prepare import sampling, spec as spec_
from servicer import BackendServicer


@dataclass
class FakeLM:
    kind: str = "text"
    name: str = ""
    options: dict = field(default_factory=dict)

    @property
    def serves(self):  # as LoadedModel declares it
        return SERVES[self.kind]


def test_the_spec_holds_what_the_request_sent():
    opts = pb.PredictOptions(
        Prompt="hi", Tokens=7, Logprobs=2, TopLogprobs=3, NDraft=4, IgnoreEOS=True, CorrelationId="c1",
        StopPrompts=["", "END"], Images=["aGk="], Metadata={"enable_thinking": "false", "speculation": "off"},
        Temperature=0.5, TopK=3, LogitBias='{"1": 2}',
        Messages=[pb.Message(role="user", content="a"), pb.Message(role="assistant", content="b")])
    s = spec_.read(FakeLM(options={"max_tokens": 9}), opts)
    assert (s.prompt, s.max_tokens, s.logprobs, s.top_logprobs, s.n_draft) == ("hi", 7, 2, 3, 4)
    assert s.ignore_eos and s.label == "c1" and s.stops == ("", "END") and s.images == ("aGk=",)
    assert s.enable_thinking == "false" and s.speculation == "off" and s.reasoning_effort == ""
    assert (s.sampling.temperature, s.sampling.top_k, s.sampling.logit_bias) == (0.5, 3, '{"1": 2}')
    assert s.defaults.max_tokens == 9 and s.defaults.top_p == 1.0  # set, and the table's default
    assert not s.chat_rendered  # a Prompt without UseTokenizerTemplate: the raw Prompt is used
    assert [m["content"] for m in s.chat_messages()] == ["a", "b"]
    assert spec_.read(FakeLM(), s) is s


def test_unset_sampling_fields_take_the_model_defaults():
    lm = FakeLM(options={"temperature": 0.7, "top_k": 5, "seed": 11})
    params = sampling.sampling_params(spec_.read(lm, pb.PredictOptions(Temperature=0.5)))
    assert (params.temperature, params.top_k, params.seed, params.top_p) == (0.5, 5, 11, 1.0)
    with pytest.raises(OptionError, match="TopP: must be within"):
        sampling.sampling_params(spec_.read(lm, pb.PredictOptions(TopP=1.5)))


def test_a_model_that_takes_text_only_refuses_media_naming_the_field():
    with pytest.raises(OptionError, match=r"Images\[1\]: not valid base64"):
        prepare.media.refuse_for_text(spec_.read(FakeLM(), pb.PredictOptions(Images=["aGk=", "@@"])))
    with pytest.raises(OptionError, match="Videos: the loaded model takes text only"):
        prepare.media.refuse_for_text(spec_.read(FakeLM(), pb.PredictOptions(Videos=["aGk="])))


def test_documents_are_ranked_most_relevant_first():
    assert prepare.ranked([0.1, 0.9, 0.5], 0) == [1, 2, 0]
    assert prepare.ranked([0.1, 0.9, 0.5], 2) == [1, 2]


@pytest.mark.parametrize("kind, method", [("text", "yes_no"), ("embedding", "cosine"), ("reranker", "pair")])
def test_relevance_is_judged_by_what_the_model_serves(kind, method):
    assert prepare.forward.rerank_method(FakeLM(kind=kind)) == method


class Engine:
    alive, dead = True, None

    def __init__(self, lm):
        self.model = lm

    def arriving(self):
        return contextlib.nullcontext()


@pytest.mark.parametrize("kind, rpc, refusal", [
    ("embedding", "generate", "the loaded model is an embedding model: it serves Embedding and Rerank only"),
    ("reranker", "generate", "the loaded model is a cross-encoder reranker: it serves Rerank only"),
    ("vision", "forward", "Embedding, Score and Rerank are not served for a vision model"),
])
def test_the_servicer_refuses_by_what_a_model_serves(kind, rpc, refusal):
    servicer = BackendServicer(Engine(FakeLM(kind=kind)))

    async def call():
        if rpc == "generate":
            return await servicer._prepared(pb.PredictOptions(Prompt="hi"))
        return await servicer._forward(None, pb.PredictOptions(Embeddings="hi"), prepare.embed_job)

    with pytest.raises(OptionError) as e:
        asyncio.run(call())
    assert str(e.value) == refusal


def test_embedding_refused_by_a_model_that_only_reranks():
    with pytest.raises(OptionError) as e:
        prepare.embed_job(FakeLM(kind="reranker"), pb.PredictOptions(Embeddings="hi"))
    assert str(e.value) == "Embedding: the loaded model is a cross-encoder reranker; it serves Rerank only"


def test_the_spec_defaults_are_the_load_option_table():
    assert isinstance(spec_.read(FakeLM(), pb.PredictOptions()).defaults, load_options.Settings)


def test_the_servicer_never_asks_a_models_kind():
    import inspect
    import re

    import backend
    import replies
    import servicer

    for module in (backend, servicer, replies):
        assert not re.search(r"\.kind\b|\"kind\"", inspect.getsource(module)), module.__name__


def test_the_engine_asks_capabilities_and_says_whether_it_is_distributed():
    """The forward passes ask what a model serves (Serves), never its kind; the servicer asks the
    engine whether it is distributed and calls its load, never probes it for attributes."""
    import inspect
    import re
    from pathlib import Path

    import servicer

    engine = Path(servicer.__file__).parent / "engine"
    for path in sorted(engine.rglob("*.py")):
        assert not re.search(r"\.kind\s*(==|!=)", path.read_text()), path
    assert not re.search(r"hasattr\((self\.)?engine\b", inspect.getsource(servicer))
