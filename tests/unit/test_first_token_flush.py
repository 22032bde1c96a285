"""A lone request's first token (sampled at admission, the direct path) reaches its caller
before the engine runs the next decode step: held back until the end of the pass, it
arrived together with the second token, one decode step late (~60-90 ms of a warm
TTFT of ~240 ms on SmolLM2 f32, bench_prefix.py). In-process, the real engine and model;
the engine's step is held until the caller has seen the first token (or a liveness bound)."""

import asyncio
import threading

import pytest

from common.launcher import backend_pb2 as pb
from engine import Engine, streams
from loaders import model_loader
import prepare

LIVENESS_S = 30.0  # only so a failing run ends: the step waits this long for the first event


@pytest.fixture(scope="module")
def model():
    return model_loader.load(model_loader.LoadSpec(model=""))


def test_the_first_token_is_delivered_before_the_next_step(model, monkeypatch):
    first_seen = threading.Event()
    released_by = []
    step = streams.Streams.step

    def held_step(self):
        if not released_by:  # the first step after admission waits for the caller's first event
            released_by.append("first event" if first_seen.wait(LIVENESS_S) else "liveness bound")
        return step(self)

    monkeypatch.setattr(streams.Streams, "step", held_step)
    engine = Engine()
    try:
        engine.swap(model).result(60)
        request = prepare.build_request(model, pb.PredictOptions(Prompt="The first token", Tokens=3,
                                                                 IgnoreEOS=True))

        async def main():
            events = []
            async for ev in engine.stream(request):
                if ev.tokens and not first_seen.is_set():
                    first_seen.set()
                events.append(ev)
            return events

        events = asyncio.run(main())
    finally:
        engine.stop()
    assert events[-1].tokens == 3 and events[-1].error is None
    assert released_by == ["first event"]
