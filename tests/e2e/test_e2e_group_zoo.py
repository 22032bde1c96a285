"""End-to-end: every family mlx-lm can divide, over 2 and over 3 ranks, tensor and pipeline, gives one process's text.

One tiny random-weight model per family whose code can split a model (tests/zoo/group_configs.py:
the zoo's config widened so heads, experts and widths divide by 2 and 3, six layers so each
pipeline stage holds layers of every kind), one group of ranks per size serving them all in turn
(LoadModel swaps), one oracle process computing mlx-lm's own single-process greedy answers
meanwhile (family_oracle.py; each comparison ends at the first step whose top-2 margin is under
1e-3: past it, summing a split layer's halves in another order may pick the other token).

For each family, size and mode (`parallel:tensor`, `parallel:pipeline`): where mlx-lm can split
the model that way (the oracle asks the model as mlx-lm's `sharded_load` does), greedy text
alone and three prompts at once must equal the library's single stream, Status must name the
mode, and a model with a recurrent cache must not run in a padded batch; where it cannot,
LoadModel must refuse naming the mode, the group still serving. A split the server refuses
though the library has it is a failure.

On this 2-core machine three ranks outnumber the cores, and a tensor-parallel step (two all_sums
per layer, each waiting for all three processes to be scheduled) costs about ten times a
pipeline step: `make test` runs every family over 2 ranks and over 3 by pipeline, and over 3 by
tensor the families of THREE_BY_TENSOR (one of each attention and cache kind); GROUP_FULL=1
(`make group-families`) runs every family every way.

FAMILIES=qwen2,deepseek_v3 restricts the run to those families.
"""

import os

import pytest

from common.launcher import backend_pb2
from conftest import own_cache_root, run_threads
from dist_support import RankGroup
from family_oracle import OracleStream, agrees, job
from zoo import group_configs, text_builder

pytestmark = pytest.mark.e2e

TOKENS = 12
PROMPTS = ("one two three one two three one two",
           "The river flows past the old mill. The sky is blue",  # the longest
           "Count 1, 2, 3")
TIMEOUT = 180
MODES = ("tensor", "pipeline")
# Caches that fold every token they see into one state: a padded batch would fold in its padding.
RECURRENT = {"ArraysCache", "MambaCache"}
# Over 3 ranks by tensor parallelism in `make test`: dense (qwen2), GQA with a window on every
# other layer (gpt_oss, with its experts), latent attention with experts (deepseek_v3), the solo
# lane (deepseek_v41), recurrent layers (qwen3_5), linear attention (kimi_k3).
THREE_BY_TENSOR = ("qwen2", "gpt_oss", "deepseek_v3", "deepseek_v41", "qwen3_5", "kimi_k3")


def _families() -> list:
    every = group_configs.candidates()
    chosen = [f.strip() for f in os.environ.get("FAMILIES", "").split(",") if f.strip()]
    return [f for f in every if f in chosen] if chosen else list(every)


FAMILIES = _families()


def _cases() -> list:
    full = os.environ.get("GROUP_FULL") == "1"
    return [(n, f, m) for n in group_configs.RANKS for f in FAMILIES for m in MODES
            if full or n == 2 or m == "pipeline" or f in THREE_BY_TENSOR]


@pytest.fixture(scope="module")
def zoo():
    from models import models_root

    return {b.family: b for b in text_builder.build_all(FAMILIES, models_root() / "zoo-group", "group_configs")}


@pytest.fixture(scope="module")
def oracle(zoo):
    built = [f for f in FAMILIES if zoo[f].status == "built"]
    stream = OracleStream([job(zoo[f].path, PROMPTS, TOKENS) for f in built])
    yield lambda family: stream.answer(built.index(family))
    stream.close()


class Groups:
    """One group of ranks at a time (2 cores hold no more), started for the first case of its
    size and stopped when a case of another size comes (the cases come by size)."""

    def __init__(self, log_dir):
        self.log_dir, self.n, self.group = log_dir, None, None

    def of(self, n: int) -> RankGroup:
        if self.n != n or self.group.proc.poll() is not None:
            self.stop()
            self.n = n
            self.group = RankGroup(n, self.log_dir, env={"MLX_BACKEND_CACHE_DIR": own_cache_root()},
                                   log_name=f"group-zoo-{n}")
            self.group.wait_healthy(300)
        return self.group

    def stop(self):
        if self.group is not None:
            self.group.stop()
        self.group = None


@pytest.fixture(scope="module")
def groups(log_dir, oracle):
    g = Groups(log_dir)
    yield g
    g.stop()


def greedy(prompt: str, label: str):
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=TOKENS, Temperature=0.0, IgnoreEOS=True,
                                      CorrelationId=label)


def status(stub) -> dict:
    return dict(stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown)


def still_serving(g) -> None:
    assert g.stub.Health(backend_pb2.HealthMessage(), timeout=30).message == b"OK"
    assert all(p.poll() is None for p in g.procs), "a rank exited"


@pytest.mark.parametrize("n,family,mode", _cases(), ids=lambda v: f"{v}ranks" if isinstance(v, int) else v)
def test_family_over_ranks(n, family, mode, groups, zoo, oracle):
    g = groups.of(n)
    built = zoo[family]
    if built.status != "built":
        pytest.skip(f"{built.status}: {built.reason}")  # the text matrix checks its refusal in one process
    answer = oracle(family)
    if "error" in answer:
        pytest.skip(f"mlx-lm's own generation fails here: {answer['error']}")
    loaded = g.load(built.path, Options=[f"parallel:{mode}"], timeout=TIMEOUT)
    message = loaded.message.replace(built.path, "<model dir>")
    if mode not in answer["divides"]:
        assert not loaded.success, f"{family}: mlx-lm has no {mode} split, yet LoadModel answered success"
        assert f"no {mode} parallelism" in message, message
        still_serving(g)
        return
    assert loaded.success, f"{family} over {n} ranks by {mode} parallelism refused: {message}"
    said = status(g.stub)
    assert [m for m in MODES if said.get(f"parallel_{m}") == 1] == [mode], said
    if RECURRENT & set(answer["cache_kinds"]):  # never a padded batch, across ranks as in one process
        assert said["lane_solo"] or said["lane_prefill_alone"], (family, answer["cache_kinds"], said)
    alone = g.stub.Predict(greedy(PROMPTS[0], f"{family}-{mode}-alone"), timeout=TIMEOUT).message.decode(
        "utf-8", "replace")
    assert agrees(alone, answer["greedy"][0]), (family, mode, n, "alone", alone, answer["greedy"][0]["text"])
    replies = run_threads([lambda p=p, k=k: g.stub.Predict(greedy(p, f"{family}-{mode}-{k}"), timeout=TIMEOUT)
                           for k, p in enumerate(PROMPTS)])
    for k, (reply, want) in enumerate(zip(replies, answer["greedy"])):
        assert not isinstance(reply, Exception), (family, mode, n, k, reply)
        got = reply.message.decode("utf-8", "replace")
        assert agrees(got, want), (family, mode, n, f"prompt {k} of three at once", got, want["text"])
