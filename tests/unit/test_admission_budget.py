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
    sizes = PrefillSizes(step_size=128, step_tokens=256, idle_tokens=1024, backlog_size=128)

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


def test_while_others_wait_a_prompt_counts_the_two_chunks_it_takes_of_a_step():
    """Admission runs while requests wait, when a prefilling prompt takes backlog_size tokens of
    a step (two chunks on the CPU): those are what it counts, for the running and the new."""
    sizes = PrefillSizes(step_size=128, step_tokens=256, idle_tokens=1024, backlog_size=256)

    def fits(new, running):
        return Admission.prefill_fits(new, running, sizes)

    decoding = slot(900, first=True)
    assert fits(slot(5000), [decoding])  # nothing prefills: it runs, whatever its size
    assert fits(slot(100), [slot(150), decoding])  # 150 + 100
    assert not fits(slot(100), [slot(300), decoding])  # 256 + 100 (one chunk each: 128 + 100)
    assert not fits(slot(40), [slot(300, cached=20), decoding])  # 256 + 40
    assert fits(slot(40), [slot(300, cached=100), decoding])  # 200 + 40
    # None decodes: the burst's bound holds four prompts taking two chunks each.
    assert fits(slot(30), [slot(400)] * 3)  # 768 + 30
    assert not fits(slot(400), [slot(400)] * 4)  # 1024 + 256 (one chunk each: 512 + 128)


def test_a_pass_before_any_model_is_served_admits_nothing_and_does_not_fail():
    """The engine's thread passes before its first swap: with none waiting, admission has no
    config to read and must not ask for one (it failed a step once, in the peers' bench)."""
    idle = streams.Streams([], {}, None)
    idle.admit()
    assert not idle.slots and not idle.waiting


def test_the_step_budget_by_device():
    """One chunk a step on the CPU (this machine's device, asked for real), two of one prompt
    while others wait; on a GPU the library's own bound, prefill_batch_size chunks, and one
    chunk a prompt whoever waits; a set option wins on both, and is the bound while some wait."""
    import mlx.core as mx

    if mx.default_device() == mx.cpu:
        assert prefill_sizes(EngineConfig(), mx) == PrefillSizes(128, 128, 128 * 8, 256)
        assert prefill_sizes(EngineConfig(prefill_step_tokens=300), mx) == PrefillSizes(128, 300, 1024, 128)
    gpu = SimpleNamespace(cpu="cpu", default_device=lambda: "gpu")
    assert prefill_sizes(EngineConfig(), gpu) == PrefillSizes(512, 512 * 8, 512 * 8, 512)
    assert prefill_sizes(EngineConfig(prefill_step_size=64, prefill_step_tokens=300), gpu) == PrefillSizes(64, 300, 512, 64)


@pytest.fixture(scope="module")
def model():
    return model_loader.load(model_loader.LoadSpec(model=""))


def run_together(model, config, prompts, tokens, monkeypatch):
    """Every prompt at once through a fresh engine. What it saw: counts (tokens of each
    request), running (most running at a step), prefilling (most prompts prefilled together in
    a step), steps ([requests waiting, prompt tokens prefilled, most of one prompt] at each
    step: what mlx-lm's prompt batch was handed, watched where it is handed over), texts (each
    request's), passes (the prompt batch's pass sizes)."""
    seen = {"running": 0, "prefilling": 0, "steps": [], "texts": {}, "passes": set()}
    step = streams.Streams.step
    prompt = PromptProcessingBatch.prompt

    def watched(self):
        seen["running"] = max(seen["running"], len(self.slots))
        seen["steps"].append([len(self.waiting), 0, 0])
        return step(self)

    def prefilled(self, tokens):
        seen["steps"][-1][1] += sum(len(t) for t in tokens)
        seen["steps"][-1][2] = max([seen["steps"][-1][2]] + [len(t) for t in tokens])
        seen["prefilling"] = max(seen["prefilling"], sum(1 for t in tokens if t))
        seen["passes"].add(self.prefill_step_size)
        return prompt(self, tokens)

    monkeypatch.setattr(streams.Streams, "step", watched)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", prefilled)
    engine = Engine(config)
    try:
        engine.swap(model).result(60)

        async def one(prompt):
            request = prepare.build_request(model, pb.PredictOptions(Prompt=prompt, Tokens=tokens, IgnoreEOS=True))
            last, text = None, ""
            async for ev in engine.stream(request):
                last, text = ev, text + "".join(d.content for d in ev.deltas)
            seen["texts"][prompt] = text
            return last.tokens

        async def main():
            return await asyncio.gather(*(one(p) for p in prompts))

        counts = asyncio.run(main())
    finally:
        engine.stop()
        monkeypatch.undo()  # a second run in the same test watches the library's own calls again
    return SimpleNamespace(counts=counts, running=seen["running"], prefilling=seen["prefilling"], steps=seen["steps"],
                           texts=[seen["texts"][p] for p in prompts], passes=seen["passes"])


def test_more_than_eight_run_side_by_side_by_default(model, monkeypatch):
    prompts = [f"Request {i}: name a colour." for i in range(12)]
    seen = run_together(model, EngineConfig(), prompts, 4, monkeypatch)
    assert seen.counts == [4] * 12
    assert seen.running == 12  # the old default (max_sequences 8) ran 8 and queued 4


def test_max_sequences_is_still_an_upper_bound(model, monkeypatch):
    prompts = [f"Request {i}: name a colour." for i in range(6)]
    seen = run_together(model, EngineConfig(max_sequences=3), prompts, 4, monkeypatch)
    assert seen.counts == [4] * 6 and seen.running == 3


def test_long_prompts_wait_for_room_in_a_steps_prefill(model, monkeypatch):
    """Three prompts of a few chunks each, with chunks of 16 and 32 prompt tokens a step (two
    prompts prefilled together at most, so an idle engine's bound is 32 too): two prefill
    together, the third waits until one of them decodes; all three complete. (Small sizes: in
    this process MLX multiplies without the server's OpenBLAS, ~10 prompt tokens a second.)"""
    prompts = [f"Document {i}. " + " ".join(f"line {j} of text number {i}." for j in range(6)) for i in range(3)]
    assert all(len(model.tokenizer.encode(p)) > 2 * 16 for p in prompts)
    config = EngineConfig(prefill_step_size=16, prefill_step_tokens=32, prefill_batch_size=2, prompt_cache_disk_bytes=0)
    seen = run_together(model, config, prompts, 3, monkeypatch)
    assert seen.counts == [3, 3, 3]
    assert seen.prefilling == 2 and seen.running == 3  # the third ran, once there was room
    assert all(tokens <= 32 for _, tokens, _ in seen.steps)


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
    seen = run_together(model, config, prompts, 3, monkeypatch)
    assert seen.counts == [3, 3, 3]
    while_waiting = [tokens for waiting, tokens, _ in seen.steps if waiting]
    assert len(while_waiting) >= 4 and 0 not in while_waiting, seen.steps


def test_while_others_wait_the_prompt_prefilling_takes_two_chunks_a_step_in_passes_of_one(model, monkeypatch):
    """The CPU's default (prefill_step_tokens unset): chunks of 16, two chunks of one prompt a
    step while others wait. Four prompts of several chunks, one running at a time (so each is
    prefilled and decoded alone, whatever the timing, in both runs): while some wait a step
    hands the prompt 32 tokens, once none does 16 at most; the library's prompt batch feeds
    them in passes of 16 all along, so the answers are those of the same prompts one chunk a
    step (prefill_step_tokens=16: the user's bound, kept), placed in more steps."""
    prompts = [f"Memo {i}: " + " ".join(f"item {j} on the shelf of room {i} is labelled." for j in range(9))
               for i in range(4)]
    assert all(len(model.tokenizer.encode(p)) > 4 * 16 for p in prompts)
    alone = dict(prefill_step_size=16, prefill_batch_size=1, max_sequences=1, prompt_cache_disk_bytes=0)
    two = run_together(model, EngineConfig(**alone), prompts, 3, monkeypatch)
    assert two.counts == [3] * 4 and two.passes == {16}
    assert any(most == 32 for waiting, _, most in two.steps if waiting), two.steps
    assert all(most <= 16 for waiting, _, most in two.steps if not waiting), two.steps
    one = run_together(model, EngineConfig(prefill_step_tokens=16, **alone), prompts, 3, monkeypatch)
    assert all(most <= 16 for _, _, most in one.steps), one.steps
    assert two.texts == one.texts and all(two.texts)
    assert len(two.steps) < len(one.steps), (two.steps, one.steps)
