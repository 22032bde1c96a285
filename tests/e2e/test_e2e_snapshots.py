"""End-to-end: a chat's later turns are served from the prefix cache for every family, and
exactly as a cold run serves them.

Families whose cache cannot be trimmed back (sliding windows past their 16 tokens,
recurrent states) used to reuse a cache only for a prompt extending a finished
request token for token. With boundary snapshots (engine.prefix.snapshots) the second turn
of a chat whose assistant message was edited, the same turn with another last
question, and the same prompt again all restore a snapshot. For each family through
the real server: turn 1 (system + user, past the windows), then those prompts; each
reports cached prompt tokens (the server log's completion line), its greedy text
equals mlx-lm's own generation in a separate process (family_oracle.py) and its
per-token logprobs equal, within 1e-4, a cold run of the same prompt (the model
loaded again: a new epoch, nothing cached). Score with stable_prefix_len on a hybrid
family: a second call sharing the stable prefix is served from it, with a cold
call's log-probabilities.
"""

import json
import re

import pytest

from common.launcher import backend_pb2
from conftest import completion_line, run_threads, serving
from family_models import FAMILIES, build
from family_oracle import Oracle, agrees, job

pytestmark = pytest.mark.e2e

TOKENS = 12
SYSTEM = ("You are a careful assistant for a small river town. You answer questions about the mill, "
          "the bridge, the ferry times and the market in short plain sentences.")
USER = "When does the first ferry leave on Sundays, and is the market open before it?"
EDITED = "The first ferry leaves at nine. The market opens at eight."  # not what the model said
USER2 = "And on public holidays?"
USER2_ALT = "Where is the ticket office?"


def chat(*turns):
    roles = ["system", "user", "assistant", "user"]
    return [dict(role=r, content=c) for r, c in zip(roles, turns)]


TURN1 = chat(SYSTEM, USER)
TURN2 = chat(SYSTEM, USER, EDITED, USER2)  # the reply edited, a new question
TURN2_ALT = chat(SYSTEM, USER, EDITED, USER2_ALT)  # the same history, another last question


def rendered(path: str, messages) -> str:
    """The chat as the model's template renders it (transformers, not the backend)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def oracle():
    """Every family's greedy answers to turn 2, from one library process started now."""
    jobs = [job(build(f), [rendered(build(f), TURN2), rendered(build(f), TURN2_ALT)], TOKENS) for f in FAMILIES]
    answers = Oracle(jobs)
    yield lambda family: answers.result()[FAMILIES.index(family)]["greedy"]
    answers.proc.kill()


@pytest.fixture(scope="module")
def backend(log_dir):
    yield from serving(log_dir / "snapshots.log", build(FAMILIES[0]))


def ask(stub, messages, label):
    reply = stub.Predict(backend_pb2.PredictOptions(
        Messages=[backend_pb2.Message(**m) for m in messages], UseTokenizerTemplate=True,
        Tokens=TOKENS, Logprobs=1, CorrelationId=label), timeout=120)
    logprobs = [e["logprob"] for e in json.loads(reply.logprobs)["content"]]
    return reply, logprobs


def cached(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


def close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 for x, y in zip(a, b))


# The memory tier is what these tests check; with the disk tier on, the reload that makes
# a run cold would read back what the swap wrote.
MEMORY_ONLY = ["prompt_cache_disk_bytes:0"]


@pytest.mark.parametrize("family", FAMILIES)
def test_edited_history_and_a_repeat_are_served_warm(backend, oracle, log_dir, family):
    path, log = build(family), log_dir / "snapshots.log"
    assert backend.load(path, Options=MEMORY_ONLY).success
    stub = backend.stub
    first, _ = ask(stub, TURN1, f"{family}-turn1")
    assert first.prompt_tokens > 60  # past the 16-token windows
    warm, warm_lp = ask(stub, TURN2, f"{family}-turn2")
    alt, alt_lp = ask(stub, TURN2_ALT, f"{family}-alt")
    again, _ = ask(stub, TURN1, f"{family}-again")

    # Turn 1's prompt without its last token is in turn 2; turn 2's up to its last message in the other.
    assert cached(log, f"{family}-turn2") >= first.prompt_tokens - 1, family
    assert cached(log, f"{family}-alt") > first.prompt_tokens, family
    assert cached(log, f"{family}-again") == first.prompt_tokens - 1, family
    assert again.message == first.message, family

    want = oracle(family)
    assert agrees(warm.message.decode("utf-8", "replace"), want[0]), (family, warm.message, want[0])
    assert agrees(alt.message.decode("utf-8", "replace"), want[1]), (family, alt.message, want[1])

    # Cold: the model loaded again (a new epoch, nothing cached), the two prompts at once
    # (admitted together: the batch generator prefills them, stopping at their boundaries).
    assert backend.load(path, Options=MEMORY_ONLY).success
    (cold, cold_lp), (cold_alt, cold_alt_lp) = run_threads([
        lambda: ask(stub, TURN2, f"{family}-turn2-cold"), lambda: ask(stub, TURN2_ALT, f"{family}-alt-cold")])
    assert cached(log, f"{family}-turn2-cold") < first.prompt_tokens - 1, family
    assert (warm.message, alt.message) == (cold.message, cold_alt.message), family
    assert len(warm_lp) == TOKENS and close(warm_lp, cold_lp), (family, warm_lp, cold_lp)
    assert len(alt_lp) == TOKENS and close(alt_lp, cold_alt_lp), (family, alt_lp, cold_alt_lp)


SCORE_STABLE = ("Notes on the river town. The mill stands by the bridge; the ferry crosses at nine, noon "
                "and five; the market fills the square on Saturdays and closes at two. ")
SCORE_CANDIDATES = [" yes", " no, not today", " the ferry"]


def last_score_cached(log_path) -> int:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if "score:" in line and "cached)" in line]
    return int(re.search(r"\((\d+) cached\)", lines[-1]).group(1))


def score(stub, tail):
    prompt = SCORE_STABLE + tail
    reply = stub.Score(backend_pb2.ScoreRequest(
        prompt=prompt, candidates=SCORE_CANDIDATES, include_token_logprobs=True,
        stable_prefix_len=len(SCORE_STABLE.encode("utf-8"))), timeout=120)
    return [c.log_prob for c in reply.candidates]


def test_score_reuses_its_stable_prefix_on_a_hybrid_model(backend, log_dir):
    path, log = build("qwen3_next"), log_dir / "snapshots.log"
    assert backend.load(path, Options=MEMORY_ONLY).success
    score(backend.stub, "Is the market open on Sunday?")
    assert last_score_cached(log) == 0
    warm = score(backend.stub, "Does the ferry run at noon?")
    assert last_score_cached(log) > 0
    assert backend.load(path, Options=MEMORY_ONLY).success  # a new epoch: nothing cached
    cold = score(backend.stub, "Does the ferry run at noon?")
    assert last_score_cached(log) == 0
    assert close(warm, cold), (warm, cold)
