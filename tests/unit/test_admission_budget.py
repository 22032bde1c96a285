"""Admission by memory with a bounded step (admission.py): more requests than the old fixed 8
run side by side when the KV budget allows, and a step's prefill stays within its token budget
(new long prompts wait, in order, for room). The decision alone on plain slots; then the real
engine and model in-process, with the step only watched (how many run, how many prefill)."""

import asyncio
from types import SimpleNamespace

import pytest
from mlx_lm.generate import PromptProcessingBatch

from common.launcher import backend_pb2 as pb
from engine import Engine, EngineConfig, streams
from engine.admission import Admission
from engine.batch_factory import PrefillSizes, prefill_sizes
from loaders import model_loader
import prepare


def slot(prompt_tokens: int, cached: int = 0, first: bool = False):
    return SimpleNamespace(request=SimpleNamespace(prompt=[1] * prompt_tokens), cached=cached,
                           t_first=1.0 if first else 0.0)


def test_a_first_chunk_fits_next_to_the_chunks_still_prefilling():
    sizes = PrefillSizes(step_size=128, step_tokens=256, idle_tokens=1024)

    def fits(new, running):
        return Admission.prefill_fits(new, running, sizes)

    decoding = slot(900, first=True)
    assert fits(slot(5000), [])  # nothing prefills: it runs, whatever its size
    assert fits(slot(5000), [decoding] * 40)  # decoding ones cost no prefill
    assert fits(slot(400), [slot(400), decoding])  # 128 + 128
    assert not fits(slot(400), [slot(400), slot(30), decoding])  # 128 + 30 + 128
    assert fits(slot(90), [slot(400), slot(30), decoding])  # 128 + 30 + 90
    assert fits(slot(400), [slot(400, cached=380), decoding])  # only its uncached 20 are prefilled
    # None decodes: a burst is prefilled together, up to the library's bound (8 chunks here).
    assert fits(slot(400), [slot(400), slot(30)])  # 128 + 30 + 128
    assert fits(slot(30), [slot(25)] * 7)  # 8 short prompts of a burst: 205 tokens
    assert not fits(slot(400), [slot(400)] * 8)  # 1024 + 128


def test_a_pass_before_any_model_is_served_admits_nothing_and_does_not_fail():
    """The engine's thread passes before its first swap: with none waiting, admission has no
    config to read and must not ask for one (it failed a step once, in the peers' bench)."""
    idle = streams.Streams([], {}, None)
    idle.admit()
    assert not idle.slots and not idle.waiting


def test_the_step_budget_by_device():
    """One chunk a step on the CPU (this machine's device, asked for real); on a GPU the
    library's own bound, prefill_batch_size chunks; a set option wins on both."""
    import mlx.core as mx

    if mx.default_device() == mx.cpu:
        assert prefill_sizes(EngineConfig(), mx) == PrefillSizes(128, 128, 128 * 8)
    gpu = SimpleNamespace(cpu="cpu", default_device=lambda: "gpu")
    assert prefill_sizes(EngineConfig(), gpu) == PrefillSizes(512, 512 * 8, 512 * 8)
    assert prefill_sizes(EngineConfig(prefill_step_size=64, prefill_step_tokens=300), gpu) == PrefillSizes(64, 300, 512)


@pytest.fixture(scope="module")
def model():
    return model_loader.load(model_loader.LoadSpec(model=""))


def run_together(model, config, prompts, tokens, monkeypatch):
    """Every prompt at once through a fresh engine; ([token counts], most running at a step,
    most prompts prefilled together in a step, [(requests waiting, prompt tokens prefilled)]
    at each step: what mlx-lm's prompt batch was handed, watched where it is handed over)."""
    seen = {"running": 0, "prefilling": 0, "steps": []}
    step = streams.Streams.step
    prompt = PromptProcessingBatch.prompt

    def watched(self):
        seen["running"] = max(seen["running"], len(self.slots))
        seen["steps"].append([len(self.waiting), 0])
        return step(self)

    def prefilled(self, tokens):
        seen["steps"][-1][1] += sum(len(t) for t in tokens)
        seen["prefilling"] = max(seen["prefilling"], sum(1 for t in tokens if t))
        return prompt(self, tokens)

    monkeypatch.setattr(streams.Streams, "step", watched)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", prefilled)
    engine = Engine(config)
    try:
        engine.swap(model).result(60)

        async def one(prompt):
            request = prepare.build_request(model, pb.PredictOptions(Prompt=prompt, Tokens=tokens, IgnoreEOS=True))
            last = None
            async for ev in engine.stream(request):
                last = ev
            return last.tokens

        async def main():
            return await asyncio.gather(*(one(p) for p in prompts))

        counts = asyncio.run(main())
    finally:
        engine.stop()
    return counts, seen["running"], seen["prefilling"], seen["steps"]


def test_more_than_eight_run_side_by_side_by_default(model, monkeypatch):
    prompts = [f"Request {i}: name a colour." for i in range(12)]
    counts, running, _, _ = run_together(model, EngineConfig(), prompts, 4, monkeypatch)
    assert counts == [4] * 12
    assert running == 12  # the old default (max_sequences 8) ran 8 and queued 4


def test_max_sequences_is_still_an_upper_bound(model, monkeypatch):
    prompts = [f"Request {i}: name a colour." for i in range(6)]
    counts, running, _, _ = run_together(model, EngineConfig(max_sequences=3), prompts, 4, monkeypatch)
    assert counts == [4] * 6 and running == 3


def test_long_prompts_wait_for_room_in_a_steps_prefill(model, monkeypatch):
    """Three prompts of a few chunks each, with chunks of 16 and 32 prompt tokens a step (two
    prompts prefilled together at most, so an idle engine's bound is 32 too): two prefill
    together, the third waits until one of them decodes; all three complete. (Small sizes: in
    this process MLX multiplies without the server's OpenBLAS, ~10 prompt tokens a second.)"""
    prompts = [f"Document {i}. " + " ".join(f"line {j} of text number {i}." for j in range(6)) for i in range(3)]
    assert all(len(model.tokenizer.encode(p)) > 2 * 16 for p in prompts)
    config = EngineConfig(prefill_step_size=16, prefill_step_tokens=32, prefill_batch_size=2, prompt_cache_disk_bytes=0)
    counts, running, prefilling, steps = run_together(model, config, prompts, 3, monkeypatch)
    assert counts == [3, 3, 3]
    assert prefilling == 2 and running == 3  # the third ran, once there was room
    assert all(tokens <= 32 for _, tokens in steps)


def test_the_next_prompt_prefills_in_the_step_after_the_last_chunk_of_the_one_before(model, monkeypatch):
    """One chunk a step, three prompts of a few chunks: while one waits, no step goes without
    prefill (the library's prompt batch holds two: the one ending leaves it in the step the
    next joins, after the join). A prompt whose chunks are done still waits two steps for its first token (the
    library feeds its last token with the split into decoding, then samples); counting it as
    prefilling until then left two steps of every prompt's turn with nothing to prefill."""
    prompts = [f"Report {i}: " + " ".join(f"entry {j} of the log kept by station {i}." for j in range(5))
               for i in range(3)]
    assert all(len(model.tokenizer.encode(p)) > 2 * 16 for p in prompts)
    config = EngineConfig(prefill_step_size=16, prefill_step_tokens=16, prefill_batch_size=2, prompt_cache_disk_bytes=0)
    counts, _, _, steps = run_together(model, config, prompts, 3, monkeypatch)
    assert counts == [3, 3, 3]
    while_waiting = [tokens for waiting, tokens in steps if waiting]
    assert len(while_waiting) >= 4 and 0 not in while_waiting, steps
