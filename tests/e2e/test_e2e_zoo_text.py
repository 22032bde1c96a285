"""End-to-end: every text family the installed mlx-lm ships serves the library's own output.

One tiny random-weight model per model_type (tests/zoo/text_builder.py), one server serving
them in turn (LoadModel swaps), one oracle process computing mlx-lm's own answers for all of
them while the server runs (family_oracle.py: `stream_generate`, a plain forward pass for
Score, each comparison ending at the first step whose top-2 margin is under 1e-3). Per family:
greedy alone (unary) equals the library; speculation on equals off; streamed equals unary;
three requests at once with prompts of different lengths each equal their alone answer; a
prompt that extends an earlier one equals the library, served from the prefix cache (for a
batch-lane family of plain KV caches the whole shared prompt, of windowed or recurrent caches
the snapshot one token short of it, as docs/prefix-cache.md says); Score equals the forward
pass. A family the library itself cannot run must be refused at LoadModel, the server still
healthy. Status's lane and the oracle's cache classes go into text.json (tests/zoo/results.py)
with every check's outcome, written after each family; docs/model-families.md is generated
from it (tests/zoo/families_doc.py, `make families-doc`).

FAMILIES=llama,mamba restricts the run to those families.
"""

import os
import re

import grpc
import pytest

from common.launcher import Backend, backend_pb2
from conftest import completion_line, run_threads
from family_oracle import OracleStream, agrees, job
from zoo import text_builder, text_families
from zoo.results import Results, entry, results_dir

pytestmark = pytest.mark.e2e

TOKENS = 16
A = "one two three one two three one two"
B = "The river flows past the old mill. The sky is blue"  # longer than A
C = "Count 1, 2, 3"  # shorter than A
A_MORE = A + " three four five six seven"
SCORE = ("The sky is", [" blue", " green today", " a"])
TIMEOUT = 120
# Cache kinds whose prefix reuse the batch lane promises exactly: a cache the library can cut
# back is cut back to the whole shared prompt; a window that wrapped or a recurrent state
# restores the snapshot taken one token short of the earlier prompt's end.
REUSED_KINDS = {"KVCache", "RotatingKVCache", "ArraysCache"}


def _families() -> list:
    every = text_families.families()
    chosen = [f.strip() for f in os.environ.get("FAMILIES", "").split(",") if f.strip()]
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        raise pytest.UsageError(f"FAMILIES names families mlx-lm does not ship: {unknown}")
    return chosen or list(every)


FAMILIES = _families()


@pytest.fixture(scope="module")
def zoo():
    return {b.family: b for b in text_builder.build_all(FAMILIES)}


@pytest.fixture(scope="module")
def oracle(zoo):
    """mlx-lm's answers for every built family, one process computing them in order."""
    built = [f for f in FAMILIES if zoo[f].status == "built"]
    stream = OracleStream([job(zoo[f].path, [A, B, C, A_MORE], TOKENS, [SCORE]) for f in built])
    yield lambda family: stream.answer(built.index(family))
    stream.close()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return Results(results_dir(tmp_path_factory) / "text.json", f"mlx-lm {text_families.version()}")


class Server:
    """One backend for the whole matrix, started again if a family's model kills it."""

    def __init__(self, log_path):
        self.log_path = log_path
        self.backend = None

    def ready(self) -> Backend:
        if self.backend is None or self.backend.proc.poll() is not None:
            self.backend = Backend(log_path=str(self.log_path))
            self.backend.wait_healthy()
        return self.backend

    def stop(self):
        if self.backend is not None:
            self.backend.stop()


@pytest.fixture(scope="module")
def server(log_dir, oracle):
    s = Server(log_dir / "zoo-text.log")
    yield s
    s.stop()


def opts(prompt: str, label: str, spec: bool = None):
    o = backend_pb2.PredictOptions(Prompt=prompt, Tokens=TOKENS, CorrelationId=label)
    if spec is not None:
        o.Metadata["speculation"] = "true" if spec else "false"
    return o


def text(reply) -> str:
    return reply.message.decode("utf-8", "replace")


def lane_of(stub):
    """Status's lane: breakdown["lane_solo"] is 1 in the solo lane, 0 in the batch; None unsaid."""
    breakdown = stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown
    return {0: "batch", 1: "solo"}.get(breakdown["lane_solo"]) if "lane_solo" in breakdown else None


class Checks:
    """Each check's outcome and the first words of why any failed; a failing check does not
    stop the others (the results file says everything that works)."""

    def __init__(self):
        self.passed, self.failures = {}, []

    def run(self, name: str, check) -> None:
        try:
            why = check()
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
        self.passed[name] = why is None
        if why is not None:
            self.failures.append(f"{name}: {why}")


def differs(got: str, answer: dict):
    """None when a served text is the oracle's (up to its last certain step), else why not."""
    return None if agrees(got, answer) else f"{got!r} != library {answer['text']!r} (cut {answer['cut']})"


def cached_tokens(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_the_library_output(family, zoo, oracle, server, results):
    built = zoo[family]
    if built.status != "built":
        results.record(family, entry(built.status, built.reason))
        pytest.skip(f"{built.status}: {built.reason}")
    answer = oracle(family)
    backend = server.ready()
    stub = backend.stub
    try:
        loaded = backend.load(built.path)
    except grpc.RpcError as e:  # the model took the server down
        loaded = backend_pb2.Result(success=False, message=f"LoadModel: {e.code().name}: {e.details()}")
    said = loaded.message.replace(built.path, "<model dir>")  # no path of this machine in the results
    if "error" in answer:
        reason = f"mlx-lm's own generation fails: {answer['error']}"
        results.record(family, entry("library-cannot", reason))
        alive = backend.proc.poll() is None
        assert alive and not loaded.success, (
            family, "the library cannot generate, yet", "it loaded" if alive else "the server died", said)
        pytest.skip(reason)
    if not loaded.success:
        results.record(family, entry("refused", said, cache_kinds=answer["cache_kinds"]))
        pytest.fail(f"{family} refused at LoadModel: {said}")
    want = dict(zip("ABCX", answer["greedy"]))
    lane = lane_of(stub)
    checks = Checks()

    def alone():
        return differs(text(stub.Predict(opts(A, f"{family}-alone", spec=False), timeout=TIMEOUT)), want["A"])

    def speculation():
        on = stub.Predict(opts(A, f"{family}-spec", spec=True), timeout=TIMEOUT)
        return differs(text(on), want["A"])

    def stream():
        got = b"".join(c.message for c in stub.PredictStream(opts(A, f"{family}-stream", spec=False),
                                                             timeout=TIMEOUT))
        return differs(got.decode("utf-8", "replace"), want["A"])

    def batched():
        replies = run_threads([lambda p=p, k=k: stub.Predict(opts(p, f"{family}-batch-{k}"), timeout=TIMEOUT)
                               for k, p in zip("ABC", (A, B, C))])
        for k, reply in zip("ABC", replies):
            if isinstance(reply, Exception):
                return f"{k}: {reply.code().name}: {reply.details()}"
            if differs(text(reply), want[k]):
                return f"{k}: {differs(text(reply), want[k])}"
        return None

    def prefix():
        label = f"{family}-prefix"
        more = stub.Predict(opts(A_MORE, label), timeout=TIMEOUT)
        if differs(text(more), want["X"]):
            return differs(text(more), want["X"])
        if lane == "solo" or not set(answer["cache_kinds"]) <= REUSED_KINDS:
            return None  # exact is all this check asks where the batch's reuse rule does not apply
        shared = len(stub.TokenizeString(backend_pb2.PredictOptions(Prompt=A), timeout=30).tokens)
        expect = shared if want["A"]["trimmable"] else shared - 1
        reused = cached_tokens(server.log_path, label)
        return None if reused == expect else f"{reused} prompt tokens from the cache, expected {expect}"

    def score():
        scored = stub.Score(backend_pb2.ScoreRequest(prompt=SCORE[0], candidates=SCORE[1]), timeout=TIMEOUT)
        for cand, got, expect in zip(SCORE[1], scored.candidates, answer["score"][0]):
            if got.log_prob != pytest.approx(expect, rel=1e-4, abs=1e-3):
                return f"{cand!r}: {got.log_prob} != forward pass {expect}"
        return None

    for name, check in (("alone", alone), ("speculation", speculation), ("stream", stream),
                        ("batched", batched), ("prefix", prefix), ("score", score)):
        checks.run(name, check)
    results.record(family, entry("served", "; ".join(checks.failures), lane=lane,
                                 cache_kinds=answer["cache_kinds"], **checks.passed))
    assert not checks.failures, (family, lane, answer["cache_kinds"], checks.failures)
