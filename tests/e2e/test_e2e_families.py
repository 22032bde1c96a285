"""End-to-end: every text family the builder makes serves the library's own output.

For each family (tiny random-weight models, family_models.py) one server loads
it and is checked against mlx-lm's own greedy generation and forward pass, run
in a separate process (family_oracle.py): greedy alone, with speculation on
and off, streamed == unary, three requests at once, a prompt that extends an
earlier one (served from the prefix cache: the whole shared prompt where the
family's cache can be trimmed back to it, else the snapshot taken one token
short of the earlier prompt's end, as the log's "cached" count shows), and
Score. docs/model-families.md states what this file checks.
"""

import re

import pytest

from common.launcher import backend_pb2
from conftest import completion_line, run_threads, serving
from family_models import FAMILIES, build
from family_oracle import Oracle, agrees, job

pytestmark = pytest.mark.e2e

TOKENS = 20
A = "one two three one two three one two"
B = "The river flows past the old mill"
C = "Numbers: 4, 8, 15, 16"
A_MORE = A + " three four five six seven"
SCORE = ("The sky is", [" blue", " green today", " a"])
# Families whose KV cache is plain attention all the way: a finished request's cache is cut back
# to the whole shared prompt. Windows that wrapped and recurrent states cannot be: they restore the
# snapshot taken at the earlier prompt's end, one token short of it (docs/model-families.md).
PREFIX_REUSE = {"llama", "qwen2", "qwen3", "phi3", "qwen3_moe"}


@pytest.fixture(scope="module")
def oracle():
    """Every family's answers from one library process, computing while the server starts."""
    answers = Oracle([job(build(f), [A, B, C, A_MORE], TOKENS, [SCORE]) for f in FAMILIES])
    yield lambda family: answers.result()[FAMILIES.index(family)]
    answers.proc.kill()


@pytest.fixture(scope="module")
def backend(log_dir, oracle):
    yield from serving(log_dir / "families.log", build(FAMILIES[0]))


def cached_tokens(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


def opts(prompt: str, label: str, spec: bool = True):
    o = backend_pb2.PredictOptions(Prompt=prompt, Tokens=TOKENS, CorrelationId=label)
    o.Metadata["speculation"] = "true" if spec else "false"
    return o


@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_the_library_output(backend, oracle, log_dir, family):
    path = build(family)
    result = backend.load(path)
    assert result.success, result.message
    answer = oracle(family)
    want = dict(zip("ABCX", answer["greedy"]))
    stub = backend.stub

    def text(reply):
        return reply.message.decode("utf-8", "replace")

    on = stub.Predict(opts(A, f"{family}-alone"), timeout=120)
    assert agrees(text(on), want["A"]), (family, "alone", on.message, want["A"])
    off = stub.Predict(opts(A, f"{family}-nospec", spec=False), timeout=120)
    assert off.message == on.message, (family, "speculation off", off.message)
    streamed = b"".join(c.message for c in stub.PredictStream(opts(A, f"{family}-stream"), timeout=120))
    assert streamed == on.message, (family, "stream", streamed)

    together = run_threads([lambda p=p, k=k: stub.Predict(opts(p, f"{family}-batch-{k}"), timeout=120)
                            for k, p in zip("ABC", (A, B, C))])
    for k, reply in zip("ABC", together):
        assert not isinstance(reply, Exception), (family, k, reply)
        assert agrees(text(reply), want[k]), (family, "batch", k, reply.message, want[k])

    more = stub.Predict(opts(A_MORE, f"{family}-prefix"), timeout=120)
    assert agrees(text(more), want["X"]), (family, "prefix", more.message, want["X"])
    reused = cached_tokens(log_dir / "families.log", f"{family}-prefix")
    shared = len(stub.TokenizeString(backend_pb2.PredictOptions(Prompt=A), timeout=60).tokens)
    assert reused == (shared if family in PREFIX_REUSE else shared - 1), (family, "cached tokens", reused, shared)

    scored = stub.Score(backend_pb2.ScoreRequest(prompt=SCORE[0], candidates=SCORE[1]), timeout=120)
    for got, expect in zip(scored.candidates, answer["score"][0]):
        assert got.log_prob == pytest.approx(expect, rel=1e-4, abs=1e-3), (family, "score", got.log_prob, expect)
