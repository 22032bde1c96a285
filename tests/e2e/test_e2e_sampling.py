"""End-to-end: sampling controls, logprobs and grammars on the real SmolLM2."""

import json
import threading

import grpc
import jsonschema
import pytest

from common.launcher import backend_pb2, chat

pytestmark = pytest.mark.e2e

Q = "What is the capital of France?"


def text(stub, opts):
    return stub.Predict(opts, timeout=120).message.decode()


def test_logit_bias_forces_and_bans_tokens(stub):
    hello = stub.TokenizeString(backend_pb2.PredictOptions(Prompt=" Hello"), timeout=30).tokens
    assert len(hello) == 1
    forced = stub.Predict(chat(Q, Tokens=3, LogitBias=json.dumps({str(hello[0]): 100})), timeout=120)
    assert forced.message.decode() == " Hello" * 3 or forced.message.decode() == "Hello" + " Hello" * 2
    plain = chat(Q, Tokens=3, Logprobs=1)
    first = json.loads(stub.Predict(plain, timeout=120).logprobs)["content"][0]["id"]
    banned = chat(Q, Tokens=3, Logprobs=1, LogitBias=json.dumps({str(first): -100}))
    assert json.loads(stub.Predict(banned, timeout=120).logprobs)["content"][0]["id"] != first


def test_repetition_penalty_changes_a_repetitive_output(stub):
    prompt = "Repeat the word 'la' forever: la la la la la la la la"
    plain = text(stub, backend_pb2.PredictOptions(Prompt=prompt, Tokens=12))
    penalised = text(stub, backend_pb2.PredictOptions(Prompt=prompt, Tokens=12, Penalty=1.8))
    assert plain.count("la") > penalised.count("la"), (plain, penalised)


def test_logprobs_one_entry_per_token_and_greedy_is_the_max(stub):
    opts = chat(Q, Tokens=10, Logprobs=3, TopLogprobs=3)
    unary = stub.Predict(opts, timeout=120)
    data = json.loads(unary.logprobs)["content"]
    assert len(data) == unary.tokens
    for e in data:
        assert set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(e["top_logprobs"]) == 3
        assert e["logprob"] == pytest.approx(max(t["logprob"] for t in e["top_logprobs"]), abs=1e-5)
        assert e["top_logprobs"][0]["id"] == e["id"]
    assert "".join(bytes(e["bytes"]).decode("utf-8", "replace") for e in data) == unary.message.decode()
    chunks = list(stub.PredictStream(opts, timeout=120))
    assert [c.logprobs for c in chunks[:-1]] == [b""] * (len(chunks) - 1)
    assert json.loads(chunks[-1].logprobs)["content"] == data


def test_logprobs_leave_out_the_stop_string(stub):
    base = stub.Predict(chat(Q, Tokens=12), timeout=120).message.decode()
    stop = " France"
    assert stop in base
    reply = stub.Predict(chat(Q, Tokens=12, Logprobs=1, StopPrompts=[stop]), timeout=120)
    data = json.loads(reply.logprobs)["content"]
    assert reply.message.decode() == base[: base.index(stop)]
    assert "".join(e["token"] for e in data) == reply.message.decode()


def test_ignore_eos_runs_to_the_token_limit(stub):
    short = stub.Predict(chat(Q, Tokens=30), timeout=120)
    assert short.tokens < 30
    full = stub.Predict(chat(Q, Tokens=30, IgnoreEOS=True), timeout=120)
    assert full.tokens == 30


def test_seeded_sampling_in_a_batch_of_eight(stub):
    opts = chat("Invent a name for a pet.", Tokens=10, Temperature=1.0, Seed=4242)
    alone = stub.Predict(opts, timeout=120).message
    results = [None] * 8

    def run(i):
        o = opts if i == 0 else chat(f"Invent a name for a pet number {i}.", Tokens=10, Temperature=1.0, Seed=i)
        results[i] = stub.Predict(o, timeout=300).message

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == alone
    assert stub.Predict(opts, timeout=120).message == alone  # and after others ran


def test_gbnf_grammar_yields_one_of_its_words(stub):
    opts = chat("Is Paris in France? Answer yes or no.", Tokens=8, Grammar='root ::= ("yes" | "no")')
    assert text(stub, opts) in ("yes", "no")
    opts = chat("Pick a color.", Tokens=8, Grammar='root ::= ("red" | "green" | "blue")', Temperature=1.0, Seed=3)
    assert text(stub, opts) in ("red", "green", "blue")


def test_json_schema_output_validates(stub):
    # Bounded fields: a 135M model left free loops on digits until Tokens cuts it.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"], "additionalProperties": False}
    opts = chat("Give the capital of France as JSON.", Tokens=80)
    opts.Metadata["json_schema"] = json.dumps(schema)
    out = text(stub, opts)
    jsonschema.validate(json.loads(out), schema)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    opts = chat("Give the capital of Italy as JSON.", Tokens=80)
    opts.Metadata["response_format"] = json.dumps(fmt)
    jsonschema.validate(json.loads(text(stub, opts)), schema)


@pytest.mark.parametrize("field,value", [
    ("LogitBias", "{not json"),
    ("LogitBias", '{"99999999": 1}'),
    ("LogitBias", '{"abc": 1}'),
    ("Grammar", "root ::= ("),
    ("TopLogprobs", 50),
    ("Logprobs", -1),
    ("MinP", 1.5),
    ("PresencePenalty", 9.0),
])
def test_bad_sampling_fields(stub, field, value):
    opts = chat(Q, Tokens=4)
    setattr(opts, field, value)
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(opts, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field.split("Top")[-1].lower() in err.value.details().lower() or field in err.value.details()


def test_bad_json_schema_is_invalid_argument(stub):
    opts = chat(Q, Tokens=4)
    opts.Metadata["json_schema"] = '{"type": 12}'
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(opts, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
