"""End-to-end: the prefix cache outlives the process (engine/prefix/disk_tier.py).

A first server serves a prompt of every family (tiny random models, family_models.py)
and is stopped with SIGTERM; a second server, on the same models and the same
MLX_BACKEND_CACHE_DIR, serves a longer prompt starting with it: from the first
server's files (the log's cached count), with the greedy text of mlx-lm's own
generation (family_oracle.py, a separate process), and for one family the same
text and logprobs as a cold run with the disk tier off. Another dtype or KV cache
type of the same model finds nothing, and Status counts the hits.
"""

import json
import re

import pytest

from common.launcher import backend_pb2
from conftest import after_restart, completion_line
from family_models import FAMILIES, build
from family_oracle import Oracle, agrees, job

pytestmark = pytest.mark.e2e

TOKENS = 12
# The first prompt ends on a period, so the second one's tokens begin with the first one's.
FIRST = "The river flows past the old mill and the stone bridge, under the willows, to the sea."
SECOND = FIRST + " Then the boats came back with fish and salt"


def cached_tokens(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


def _load(backend, family, **fields):
    result = backend.load(build(family), **fields)
    assert result.success, result.message


def _predict(backend, prompt, label, tokens=TOKENS, logprobs=False):
    o = backend_pb2.PredictOptions(Prompt=prompt, Tokens=tokens, CorrelationId=label)
    if logprobs:
        o.Logprobs = 1
    return backend.stub.Predict(o, timeout=120)


@pytest.fixture(scope="module")
def oracle():
    answers = Oracle([job(build(f), [SECOND], TOKENS) for f in FAMILIES])
    yield lambda family: answers.result()[FAMILIES.index(family)]["greedy"][0]
    answers.proc.kill()


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, log_dir, oracle):
    """The second server, after the first served FIRST for every family and was stopped."""
    def first_work(first):
        for family in FAMILIES:
            _load(first, family)  # a swap keeps the previous family's entries on disk
            _predict(first, FIRST, f"{family}-first", tokens=1)  # the entry: exactly FIRST's tokens

    yield from after_restart(tmp_path_factory.mktemp("backend-cache"), log_dir, "disk", first_work)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_restarted_server_serves_from_disk(restarted, oracle, family):
    backend, log = restarted
    _load(backend, family)
    reply = _predict(backend, SECOND, f"{family}-second")
    assert cached_tokens(log, f"{family}-second") > 0, family
    text = reply.message.decode("utf-8", "replace")
    assert agrees(text, oracle(family)), (family, text, oracle(family))


def test_a_disk_hit_equals_a_cold_run_and_status_counts_it(restarted):
    backend, log = restarted
    _load(backend, "llama", Options=["prompt_cache_disk_bytes:0"])  # no disk tier: cold
    cold = _predict(backend, SECOND, "llama-cold", logprobs=True)
    assert cached_tokens(log, "llama-cold") == 0
    _load(backend, "llama")
    warm = _predict(backend, SECOND, "llama-warm", logprobs=True)
    assert cached_tokens(log, "llama-warm") > 0
    assert warm.message == cold.message
    got, want = json.loads(warm.logprobs)["content"], json.loads(cold.logprobs)["content"]
    assert [e["id"] for e in got] == [e["id"] for e in want]
    for g, w in zip(got, want):
        assert g["logprob"] == pytest.approx(w["logprob"], abs=1e-4)
    figures = backend.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown
    # The load made a new cache: its figures are this one request's.
    assert figures["prompt_cache_hits_disk"] == 1 and figures["prompt_cache_hits_memory"] == 0
    assert figures["prompt_cache_tokens_saved"] == cached_tokens(log, "llama-warm")
    assert figures["prompt_cache_entries"] >= 1
    assert figures["prompt_cache_disk_entries"] >= 1 and figures["prompt_cache_disk_bytes"] > 0


@pytest.mark.parametrize("fields", [dict(Options=["dtype:float16"]), dict(CacheTypeKey="f16", CacheTypeValue="f16")],
                         ids=["dtype", "kv-cache-type"])
def test_another_dtype_or_kv_cache_type_finds_nothing(restarted, fields):
    backend, log = restarted
    _load(backend, "qwen2", **fields)
    label = "qwen2-other-" + "-".join(sorted(fields))
    _predict(backend, SECOND, label)
    assert cached_tokens(log, label) == 0
