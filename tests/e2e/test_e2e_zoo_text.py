"""End-to-end: every text family the installed mlx-lm ships serves the library's own output.

One tiny random-weight model per model_type (tests/zoo/text_builder.py), two servers taking
them in turn (LoadModel swaps; one loads the next family while the other is checked), one
oracle process computing mlx-lm's own answers for all of them while the servers run
(family_oracle.py: `stream_generate`, a plain forward pass for Score, each comparison ending
at the first step whose top-2 margin is under 1e-3). Per family:
greedy alone (unary) equals the library, with speculation off and on; streamed equals it;
three requests at once with prompts of different lengths each equal their alone answer; a
prompt that extends an earlier one equals the library, served from the prefix cache (in the
batch lane: the whole shared prompt where the library's cache can be cut back, else the
snapshot one token short of it, as docs/prefix-cache.md says); Score equals the forward pass.
A family the library itself cannot run must be refused at LoadModel, the server still up
(unless the library's native code killed it). Status's lane and the oracle's cache classes go
into text.json (tests/zoo/results.py) with every check's outcome, written after each family;
docs/model-families.md is generated from it (tests/zoo/families_doc.py, `make families-doc`).

FAMILIES=llama,mamba restricts the run to those families.
"""

import concurrent.futures
import os
import re
import subprocess
import threading
from dataclasses import dataclass

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
STARTUP = 300  # seconds a backend may take to answer Health
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


class Slot:
    """One backend, started again if a family's model kills it."""

    def __init__(self, log_path):
        self.log_path = log_path
        self.backend = None
        self.lock = threading.Lock()  # its start (a thread of Server's) and a load may ask at once

    def ready(self) -> Backend:
        with self.lock:
            if self.backend is None or self.backend.proc.poll() is not None:
                backend = Backend(log_path=str(self.log_path))
                try:  # three processes import MLX at once here, next to other work: a generous bound
                    backend.wait_healthy(timeout=STARTUP)
                except BaseException:
                    backend.stop()
                    raise
                self.backend = backend
            return self.backend

    def stop(self):
        if self.backend is not None:
            self.backend.stop()

    def log_size(self) -> int:
        return os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0

    def last_exception(self, since: int):
        """The last exception line ("ValueError: ...") the server logged after byte `since`."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            lines = f.read().decode("utf-8", "replace").splitlines()
        found = [line for line in lines if re.match(r"\w+(Error|Exception): ", line)]
        return found[-1][:300] if found else None


class Server:
    """Two backends taking the families in turn: while one serves a family's checks, the other
    loads the next family (its LoadModel, lane check and trial: about half a family's time)."""

    def __init__(self, log_dir):
        self.slots = [Slot(log_dir / f"zoo-text-{i}.log") for i in range(2)]
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.ahead = {}  # family -> (slot, the future of its load)
        self.turn = 0
        for slot in self.slots:  # both start while the oracle starts
            self.pool.submit(slot.ready)

    def take(self, family: str, path: str):
        """(slot, LoadModel's Result, exit code) of `family`, loaded ahead or now."""
        if family not in self.ahead:
            self._ahead(family, path)
        slot, future = self.ahead.pop(family)
        return (slot, *future.result())

    def next(self, family: str, path: str) -> None:
        """Start loading `family` on the slot the current family does not use."""
        if family not in self.ahead:
            self._ahead(family, path)

    def _ahead(self, family: str, path: str) -> None:
        slot = self.slots[self.turn]
        self.turn = 1 - self.turn
        self.ahead[family] = (slot, self.pool.submit(lambda: load(slot.ready(), path)))

    def stop(self):
        self.pool.shutdown(wait=True)
        for slot in self.slots:
            slot.stop()


@pytest.fixture(scope="module")
def server(log_dir, oracle):
    s = Server(log_dir)
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


@dataclass
class Why:
    """Why a check failed: in words for the results file (and the doc), and the evidence
    (texts of random models are mostly unprintable bytes) for this test's own message."""
    said: str
    evidence: str = ""


class Checks:
    """Each check's outcome; a failing check does not stop the others (the results file says
    everything that works). An INTERNAL error is said with the exception the server logged."""

    def __init__(self, slot):
        self.slot, self.since = slot, slot.log_size()
        self.passed, self.failures = {}, []

    def run(self, name: str, check) -> None:
        try:
            why = check()
        except grpc.RpcError as e:
            why = self.rpc_error(e)
        self.passed[name] = why is None
        if why is not None:
            self.failures.append((name, why if isinstance(why, Why) else Why(why)))

    def rpc_error(self, e) -> Why:
        said = f"{e.code().name}: {e.details()}"
        logged = self.slot.last_exception(self.since) if e.code() == grpc.StatusCode.INTERNAL else None
        return Why(f"{said} ({logged})" if logged else said)

    def reason(self) -> str:
        return "; ".join(f"{name}: {why.said}" for name, why in self.failures)

    def evidence(self) -> list:
        return [f"{name}: {why.said} {why.evidence}" for name, why in self.failures]


def differs(got: str, answer: dict):
    """None when a served text is the oracle's (up to its last certain step), else why not."""
    if agrees(got, answer):
        return None
    want = answer["text"] if answer["cut"] is None else answer["exact"]
    where = len(os.path.commonprefix([got, want]))
    certain = "every token certain" if answer["cut"] is None else f"certain up to token {answer['cut']}"
    return Why(f"differs from mlx-lm's text from character {where} on", f"{got!r} != {answer['text']!r} ({certain})")


def cached_tokens(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


def load(backend, path: str):
    """LoadModel's Result, and the server's exit code when loading it took the server down."""
    try:
        return backend.load(path), None
    except grpc.RpcError as e:
        try:
            code = backend.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        return backend_pb2.Result(success=False, message=f"{e.code().name}: {e.details()}"), code


def must_refuse(family, results, reason: str, loaded, exit_code) -> None:
    """A family the library cannot run here: LoadModel must not answer success, and the server
    must stay up unless the library's native code crashed it (a signal: the host restarts it)."""
    said = f"{reason}; LoadModel: {loaded.message}" if loaded.message else reason
    if exit_code is not None:
        said += f" (the server exited: {exit_code})"
    results.record(family, entry("library-cannot", said))
    assert not loaded.success, (family, "LoadModel answered success, though", reason)
    assert exit_code is None or exit_code < 0, (family, f"the server exited ({exit_code}) at LoadModel", reason)
    pytest.skip(f"library-cannot: {said}")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_the_library_output(family, zoo, oracle, server, results):
    built = zoo[family]
    if built.path is None:
        results.record(family, entry(built.status, built.reason))
        pytest.skip(f"{built.status}: {built.reason}")
    slot, loaded, exit_code = server.take(family, built.path)
    later = [f for f in FAMILIES[FAMILIES.index(family) + 1:] if zoo[f].path is not None]
    if later:  # loads while this family's checks run
        server.next(later[0], zoo[later[0]].path)
    answer = oracle(family) if built.status == "built" else {"error": built.reason}
    backend = slot.backend
    stub = backend.stub
    loaded.message = loaded.message.replace(built.path, "<model dir>")  # no path of this machine in results
    if "error" in answer:
        lib = answer["error"] if built.status != "built" else f"mlx-lm's own generation fails: {answer['error']}"
        must_refuse(family, results, lib, loaded, exit_code)
    if not loaded.success:
        results.record(family, entry("refused", loaded.message, cache_kinds=answer["cache_kinds"]))
        pytest.fail(f"{family} refused at LoadModel: {loaded.message}")
    want = dict(zip("ABCX", answer["greedy"]))
    lane = lane_of(stub)
    checks = Checks(slot)

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
            why = checks.rpc_error(reply) if isinstance(reply, Exception) else differs(text(reply), want[k])
            if why is not None:
                return Why(f"prompt {k}: {why.said}", why.evidence)
        return None

    def prefix():
        label = f"{family}-prefix"
        mismatch = differs(text(stub.Predict(opts(A_MORE, label), timeout=TIMEOUT)), want["X"])
        if mismatch is not None:
            return mismatch
        if lane == "solo" or not set(answer["cache_kinds"]) <= REUSED_KINDS:
            return None  # exact is all this check asks where the batch's reuse rule does not apply
        shared = len(stub.TokenizeString(backend_pb2.PredictOptions(Prompt=A), timeout=30).tokens)
        expect = shared if want["A"]["trimmable"] else shared - 1
        reused = cached_tokens(slot.log_path, label)
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
    results.record(family, entry("served", checks.reason(), lane=lane, cache_kinds=answer["cache_kinds"],
                                 **checks.passed))
    assert not checks.failures, (family, lane, answer["cache_kinds"], checks.evidence())
