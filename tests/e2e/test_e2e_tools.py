"""End-to-end: tool calls and reasoning, streamed as they happen, with real models.

Qwen2.5-Coder-0.5B-Instruct (joined from its PyPI parts) for tool calls, and its Score and
Rerank (here, not in test_e2e_embed.py: a second load of this model costs more than all
these tests); SmolLM2 with a thinking chat template (tests/models.py) for reasoning.
"""

import json

import pytest

from common.launcher import backend_pb2, chat
from conftest import serving
from models import qwen_coder_gguf, thinking_model_dir

pytestmark = pytest.mark.e2e

TOOLS = json.dumps([{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
WEATHER = "What is the weather in Paris right now?"


def merge(chunks):
    """Merge chat deltas the way the host does."""
    content, reasoning, calls = "", "", {}
    for c in chunks:
        for d in c.chat_deltas:
            content += d.content
            reasoning += d.reasoning_content
            for t in d.tool_calls:
                call = calls.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = t.id or call["id"]
                call["name"] = t.name or call["name"]
                call["arguments"] += t.arguments
    return content, reasoning, [calls[i] for i in sorted(calls)]


@pytest.fixture(scope="module")
def qwen(log_dir):
    yield from serving(log_dir / "qwen.log", "qwen2.5-coder-0.5b-instruct",
                       ModelFile=qwen_coder_gguf(), timeout=900)


def closing_token(entries):
    """Index of the generated token whose bytes complete the leading JSON value."""
    data = b"".join(bytes(e["bytes"]) for e in entries)
    text = data.decode()
    lead = len(text) - len(text.lstrip())
    value, end = json.JSONDecoder().raw_decode(text, lead)
    end_byte, upto = len(text[:end].encode()), 0
    for k, e in enumerate(entries):
        upto += len(e["bytes"])
        if upto >= end_byte:
            return k, value
    raise AssertionError("unreachable")


def test_streamed_tool_call(qwen):
    opts = chat(WEATHER, Tokens=40, Tools=TOOLS, Logprobs=1)
    chunks = list(qwen.stub.PredictStream(opts, timeout=600))
    content, _, calls = merge(chunks)
    assert len(calls) == 1, calls
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert content.strip() == ""
    for c in chunks:
        assert "<tool_call>" not in c.message.decode()
        assert all("<tool_call>" not in d.content and "{" not in d.content for d in c.chat_deltas)
    # The call leaves as soon as it is whole: on the token that closes its JSON
    # (Reply.tokens is the running count). The model ends right after that token
    # (end of sequence, not counted), so the last chunk has the same count: the
    # call must also come in its own chunk before it, not held until the end.
    k, value = closing_token(json.loads(chunks[-1].logprobs)["content"])
    assert value["name"] == "get_weather"
    carrying = [i for i, c in enumerate(chunks) if any(d.tool_calls for d in c.chat_deltas)]
    assert len(carrying) == 1, carrying
    assert chunks[carrying[0]].tokens == k + 1
    assert carrying[0] < len(chunks) - 1


def test_unary_tool_call_matches_the_stream(qwen):
    reply = qwen.stub.Predict(chat(WEATHER, Tokens=40, Tools=TOOLS), timeout=600)
    assert len(reply.chat_deltas) == 1
    delta = reply.chat_deltas[0]
    assert [(t.index, t.name) for t in delta.tool_calls] == [(0, "get_weather")]
    assert json.loads(delta.tool_calls[0].arguments) == {"city": "Paris"}
    assert reply.message == b"" and delta.content.strip() == ""


def test_call_cut_by_tokens_keeps_every_character(qwen):
    opts = chat(WEATHER, Tokens=8, Tools=TOOLS, Logprobs=1)
    chunks = list(qwen.stub.PredictStream(opts, timeout=600))
    content, reasoning, calls = merge(chunks)
    generated = b"".join(bytes(e["bytes"]) for e in json.loads(chunks[-1].logprobs)["content"]).decode()
    assert chunks[-1].tokens == 8
    assert not calls
    assert content == generated and generated.startswith('{"name"')
    unary = qwen.stub.Predict(chat(WEATHER, Tokens=8, Tools=TOOLS), timeout=600)
    assert unary.message.decode() == generated


def test_without_tools_json_stays_content(qwen):
    reply = qwen.stub.Predict(chat("Write the JSON object {\"a\": 1} and nothing else.", Tokens=12), timeout=600)
    assert not reply.chat_deltas[0].tool_calls
    assert "{" in reply.message.decode()


def test_qwen_model_metadata(qwen):
    meta = qwen.stub.ModelMetadata(backend_pb2.ModelOptions(), timeout=60)
    assert meta.tool_format.format_type == "json_tools"
    assert meta.tool_format.per_call_start == "<tool_call>"
    assert meta.tool_format.per_call_end == "</tool_call>"
    assert not meta.supports_thinking
    assert "<|im_start|>assistant" in meta.rendered_template


def test_qwen_prefers_paris_and_ranks_the_relevant_document_first(qwen):
    stub = qwen.stub
    paris, london = stub.Score(backend_pb2.ScoreRequest(prompt="The capital of France is",
                                                        candidates=[" Paris", " London"]), timeout=300).candidates
    assert paris.log_prob > london.log_prob
    docs = ["Bananas are a good source of potassium.", "Paris is the capital of France."]
    reply = stub.Rerank(backend_pb2.RerankRequest(query="What is the capital of France?", documents=docs), timeout=300)
    assert [r.index for r in reply.results] == [1, 0]
    assert 0.0 <= reply.results[1].relevance_score < reply.results[0].relevance_score <= 1.0


@pytest.fixture(scope="module")
def thinker(log_dir):
    yield from serving(log_dir / "thinker.log", thinking_model_dir())


THOUGHT = "The user asks for the capital of France. It is Paris."
ANSWER = "The capital of France is Paris."
GRAMMAR = f'root ::= "{THOUGHT}" "</think>" "{ANSWER}"'


def test_reasoning_streams_apart_from_content(thinker):
    opts = chat("What is the capital of France?", Tokens=60, Grammar=GRAMMAR)
    chunks = list(thinker.stub.PredictStream(opts, timeout=300))
    content, reasoning, calls = merge(chunks)
    assert reasoning == THOUGHT
    assert content == ANSWER
    assert not calls
    # Reasoning arrived while the model thought: several chunks, all before any content.
    kinds = [("r" if d.reasoning_content else "c") for c in chunks for d in c.chat_deltas
             if d.reasoning_content or d.content]
    assert kinds.count("r") >= 3
    assert "".join(kinds).rstrip("c") == "r" * kinds.count("r")
    for c in chunks:
        assert "think>" not in c.message.decode()
    unary = thinker.stub.Predict(opts, timeout=300)
    assert unary.chat_deltas[0].reasoning_content == THOUGHT
    assert unary.chat_deltas[0].content == ANSWER == unary.message.decode()


def test_reasoning_cut_by_tokens_stays_reasoning(thinker):
    opts = chat("What is the capital of France?", Tokens=5, Grammar=GRAMMAR)
    content, reasoning, _ = merge(thinker.stub.PredictStream(opts, timeout=300))
    assert content == "" and reasoning and THOUGHT.startswith(reasoning)


def test_thinking_off_starts_in_content(thinker):
    opts = chat("What is the capital of France?", Tokens=30, Grammar=f'root ::= "{ANSWER}"')
    opts.Metadata["enable_thinking"] = "false"
    content, reasoning, _ = merge(thinker.stub.PredictStream(opts, timeout=300))
    assert (content, reasoning) == (ANSWER, "")


def test_thinking_model_metadata(thinker):
    meta = thinker.stub.ModelMetadata(backend_pb2.ModelOptions(), timeout=60)
    assert meta.supports_thinking
    assert meta.rendered_template.rstrip().endswith("<think>")
    assert (meta.tool_format.reasoning_start, meta.tool_format.reasoning_end) == ("<think>", "</think>")
