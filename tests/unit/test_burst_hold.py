"""A burst is prefilled in one pass: the engine holds a lone request while another is being
prepared (Engine.arriving), and no longer than its cap. In-process, the real engine and model;
the batch's admit and step are wrapped to record the order in which the engine calls them."""

import asyncio

import pytest

from common.launcher import backend_pb2 as pb
from engine import Engine, core
from engine.lanes.text_batch import TextBatch
from loaders import model_loader
import prepare


@pytest.fixture(scope="module")
def model():
    return model_loader.load(model_loader.LoadSpec(model=""))


@pytest.fixture
def calls(monkeypatch):
    """("admit", direct) and ("step",) in the order the engine makes them."""
    seen = []
    admit, step = TextBatch.admit, TextBatch.step

    def admit_spy(self, *args, **kwargs):
        seen.append(("admit", kwargs.get("direct", False)))
        return admit(self, *args, **kwargs)

    def step_spy(self):
        seen.append(("step",))
        return step(self)

    monkeypatch.setattr(TextBatch, "admit", admit_spy)
    monkeypatch.setattr(TextBatch, "step", step_spy)
    return seen


async def _collect(engine, request):
    return [ev async for ev in engine.stream(request)]


def _burst(model, prepare_s: float = 0.0):
    """Request A is submitted while B is "being prepared", then B is submitted (as the
    servicer does: prepare inside Engine.arriving, then stream). With `prepare_s`, B's
    preparation lasts that long; without, it lasts until A has finished (which it only does
    if the hold on A ends by itself). Returns whether A had finished when B's preparation
    ended, and the token count of each."""
    engine = Engine()
    try:
        engine.swap(model).result(60)
        a, b = (prepare.build_request(model, pb.PredictOptions(Prompt=p, Tokens=4, IgnoreEOS=True))
                for p in ("The first of two", "The second of two"))

        async def main():
            with engine.arriving():
                task_a = asyncio.create_task(_collect(engine, a))
                if prepare_s:
                    await asyncio.sleep(prepare_s)
                else:  # a liveness bound only: a hold without a cap would never let A finish
                    await asyncio.wait([task_a], timeout=120)
                a_done = task_a.done()
            events_b = await _collect(engine, b)
            return a_done, (await task_a)[-1].tokens, events_b[-1].tokens

        return asyncio.run(main())
    finally:
        engine.stop()


def test_a_request_waits_for_one_being_prepared_and_they_prefill_together(model, calls, monkeypatch):
    monkeypatch.setattr(core, "COALESCE_S", 30.0)  # the cap out of the way: this is the hold itself
    a_done, tokens_a, tokens_b = _burst(model, prepare_s=0.5)
    assert not a_done
    assert (tokens_a, tokens_b) == (4, 4)
    # Both admitted in one pass, neither alone by the direct path, before any step ran.
    assert calls[:2] == [("admit", False), ("admit", False)], calls[:4]
    assert calls.count(("admit", False)) == 2 and ("admit", True) not in calls


def test_the_hold_ends_at_its_cap_when_a_preparation_takes_long(model, calls, monkeypatch):
    monkeypatch.setattr(core, "COALESCE_S", 0.05)
    a_done, tokens_a, tokens_b = _burst(model)
    assert a_done, "the first request waited for a preparation past the cap"
    assert (tokens_a, tokens_b) == (4, 4)
    assert calls[0] == ("admit", True)  # alone: the direct path
