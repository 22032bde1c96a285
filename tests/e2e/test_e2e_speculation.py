"""End-to-end: speculative decoding changes speed, never text.

Greedy output with speculation equals the output without it (Metadata
`speculation: false` on the same server), over prompts that stop on a stop
string, hit max tokens inside a draft, end with EOS inside an accepted draft
and split UTF-8 characters across drafted tokens; streaming equals Predict; a
second request arriving mid-speculation gets its own output and the first
continues exactly. The server log tells whether drafts were accepted, so a
case that never speculated cannot pass unnoticed.
"""

import json
import os
import re
import threading

import grpc
import pytest

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving
from draft_models import short_copy

pytestmark = pytest.mark.e2e

PARA = ("The quick brown fox jumps over the lazy dog near the river bank while the farmer "
        "watches from his old wooden porch, drinking coffee and reading yesterday's newspaper.")
QUOTE = f"Repeat this sentence exactly, but replace 'fox' with 'cat':\n\n{PARA}"


def opts_for(case: str, spec: bool):
    kind, fields = CASES[case]
    o = chat(kind, **fields) if not kind.startswith("raw:") else backend_pb2.PredictOptions(Prompt=kind[4:], **fields)
    o.Metadata["speculation"] = "true" if spec else "false"
    o.CorrelationId = f"spec-{case}-{'on' if spec else 'off'}"
    return o


CASES = {
    "quote": (QUOTE, dict(Tokens=32)),
    "stop-string": (QUOTE, dict(Tokens=32, StopPrompts=["wooden"])),
    "max-tokens-mid-draft": (QUOTE, dict(Tokens=9)),
    "eos-in-draft": ("Repeat exactly: The cat sat on the mat.", dict(Tokens=40)),
    "utf8": ("Repeat exactly: Le café coûte 3 €, 日本語のテキスト, naïve façade 🙂🙂.", dict(Tokens=28)),
    "raw-count": ("raw:1, 2, 3, 4, 5, 6, 7, 8,", dict(Tokens=16)),
}


def drafts_accepted(log_path, label: str) -> int:
    """Drafted tokens accepted for the request labelled `label` (0 when it never speculated)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if f"({label})" in line and "completion" in line:
                m = re.search(r"drafts accepted (\d+)/(\d+)", line)
                return int(m.group(1)) if m else 0
    raise AssertionError(f"no log line for {label}")


def stream_text(stub, o) -> bytes:
    return b"".join(c.message for c in stub.PredictStream(o, timeout=300))


@pytest.fixture(scope="module")
def server_log(server, log_dir):
    return log_dir / "server.log"


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_output_is_identical_with_speculation(stub, server_log, case):
    off = stub.Predict(opts_for(case, False), timeout=300)
    on = stub.Predict(opts_for(case, True), timeout=300)
    assert on.message == off.message, (case, on.message, off.message)
    assert on.tokens == off.tokens
    on.message.decode("utf-8")  # whole characters only
    assert drafts_accepted(server_log, f"spec-{case}-off") == 0
    assert drafts_accepted(server_log, f"spec-{case}-on") > 0, f"{case}: no draft was accepted"
    assert stream_text(stub, opts_for(case, True)) == on.message
    if case == "eos-in-draft":  # ended by the model, inside an accepted run of the prompt's own ending
        assert on.tokens < CASES[case][1]["Tokens"]
    if case == "max-tokens-mid-draft":
        assert on.tokens == 9


def test_logprobs_are_those_of_plain_decoding(stub):
    def run(spec):
        o = opts_for("quote", spec)
        o.Tokens, o.Logprobs, o.TopLogprobs = 16, 2, 2
        return stub.Predict(o, timeout=300)

    off, on = json.loads(run(False).logprobs)["content"], json.loads(run(True).logprobs)["content"]
    assert [e["id"] for e in on] == [e["id"] for e in off]
    for a, b in zip(on, off):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=2e-3)
        assert [t["id"] for t in a["top_logprobs"]] == [t["id"] for t in b["top_logprobs"]]


def test_a_second_request_mid_speculation_leaves_both_exact(stub, server_log):
    first = opts_for("quote", True)
    first.Tokens, first.CorrelationId = 40, "spec-joined-first"
    second = chat("Name three colors.", Tokens=12)
    alone = [stub.Predict(first, timeout=300).message, stub.Predict(second, timeout=300).message]
    started = threading.Event()

    def run_first():
        out = []
        for c in stub.PredictStream(first, timeout=300):
            out.append(c.message)
            started.set()
        return b"".join(out)

    def run_second():
        assert started.wait(120)
        return stub.Predict(second, timeout=300).message

    assert run_threads([run_first, run_second]) == alone
    assert drafts_accepted(server_log, "spec-joined-first") > 0


def test_seeded_sampling_draws_the_same_text_with_speculation(stub, server_log):
    def run(spec):
        o = opts_for("quote", spec)
        o.Temperature, o.TopP, o.Seed, o.Tokens = 0.5, 0.95, 1234, 24
        o.CorrelationId += "-sampled"
        return stub.Predict(o, timeout=300).message

    assert run(True) == run(False)
    assert drafts_accepted(server_log, "spec-quote-on-sampled") > 0


def test_bad_speculation_settings_are_refused(server, stub):
    for options, field in ((["speculation:sometimes"], "speculation"), (["n_draft:0"], "n_draft"),
                           (["ngram_size:2", "ngram_min:3"], "ngram_min"), (["speculation:draft"], "DraftModel")):
        result = server.load("", Options=options)
        assert not result.success and field in result.message, (options, result.message)
    o = opts_for("quote", True)
    o.NDraft = -1
    with pytest.raises(grpc.RpcError) as e:
        stub.Predict(o, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "NDraft" in e.value.details()
    assert stub.Predict(chat("Hi", Tokens=2), timeout=60).tokens == 2  # still serving


# ---- a draft model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def drafting(log_dir):
    from loaders.model_loader import embedded_default

    yield from serving(log_dir / "speculation-draft.log", embedded_default(), DraftModel=short_copy(6))


def test_a_draft_model_keeps_greedy_output_identical(drafting):
    from loaders.model_loader import embedded_default

    cases = ["stop-string", "max-tokens-mid-draft", "eos-in-draft", "utf8"]
    plain = {case: drafting.stub.Predict(opts_for(case, False), timeout=300) for case in cases}
    # A poor draft (mostly rejected), then the model drafting for itself (always accepted).
    for draft, tried in ((short_copy(6), cases), (embedded_default(), cases[1:3])):
        if draft != short_copy(6):
            result = drafting.load(embedded_default(), DraftModel=draft, Options=["n_draft:3"])
            assert result.success, result.message
        for case in tried:
            o = opts_for(case, True)
            o.CorrelationId += f"-{os.path.basename(draft)}"
            on = drafting.stub.Predict(o, timeout=300)
            assert (on.message, on.tokens) == (plain[case].message, plain[case].tokens), (draft, case)
    accepted = drafts_accepted(drafting.log_path, f"spec-max-tokens-mid-draft-on-{os.path.basename(draft)}")
    assert accepted == 6  # 9 tokens: the first from the prefill, then 3 + 3 drafted and accepted, 2 more


def test_a_draft_with_another_vocabulary_is_refused(drafting):
    from loaders.model_loader import embedded_default

    from models import thinking_model_dir

    result = drafting.load(embedded_default(), DraftModel=thinking_model_dir())
    assert not result.success and "vocabulary" in result.message, result.message
    result = drafting.load(embedded_default(), DraftModel="/no/such/draft-model")
    assert not result.success and "DraftModel" in result.message, result.message
    assert drafting.stub.Predict(chat("Hi", Tokens=2), timeout=60).tokens == 2  # the old model still serves
