"""End-to-end: the solo lane and the lane chosen at load, through the real server.

One server serves tiny models (solo_models.py, built with mlx-lm's own classes) in turn, one
per cause the lane choice sees: a chunked cache (llama4), a cache class outside mlx-lm's
batch (deepseek_v41), a batched step that raises (gemma2, gpt_bigcode), a recurrent state
the batch's padding would reach (mamba: the batch with each prompt prefilled alone). Each is
compared with mlx-lm's own greedy generation run in one separate process (family_oracle.py),
alone and three at once; the solo lane serves the three in their order of arrival. On gemma2
in the solo lane: stop strings, logprobs, seeds, a JSON schema, cancellation, the queue bound,
a prompt past the context, Health and Status while it runs. The prefix cache as each cache
kind allows; Gemma 3 vision in the lane the check picks (the batch) and in the solo lane, against
mlx-vlm's own generation (vision_oracle.py).
"""

import json
import re
import threading
import time

import grpc
import pytest

from common.launcher import backend_pb2, chat
from conftest import completion_line, run_threads, serving
from family_oracle import Oracle, agrees, job
from solo_models import FAMILIES, build

pytestmark = pytest.mark.e2e

TOKENS = 16
PROMPTS = {  # A_MORE extends A, D_MORE extends D (D is served only in the solo lane's snapshot test)
    "A": "one two three one two three one two", "B": "The river flows past the old mill",
    "C": "Numbers: 4, 8, 15, 16", "D": "Red, green, blue and red again",
}
PROMPTS.update(A_MORE=PROMPTS["A"] + " three four five six seven", D_MORE=PROMPTS["D"] + ", then yellow and white")
A, B, C, A_MORE, D = (PROMPTS[k] for k in ("A", "B", "C", "A_MORE", "D"))

# family: (Status lane_solo, lane_prefill_alone, the words of its load's lane line)
LANES = {
    "llama4": (1, 0, "solo (its ChunkedKVCache cache cannot be merged into mlx-lm's batch"),
    "deepseek_v41": (1, 0, "solo (its LayerCache cache cannot be merged into mlx-lm's batch"),
    "gemma2": (1, 0, "solo (batched, it fails request A (INTERNAL: the step failed: ValueError: [broadcast_shapes]"),
    "gpt_bigcode": (1, 0, "solo (batched, it fails request A (INTERNAL: the step failed"),
    "mamba": (0, 1, "batch, each prompt prefilled alone (batched, it keeps a recurrent state, which left padding "
                    "would enter; prefilled alone, it gives the single stream's tokens"),
}
# Prompt tokens of A_MORE served from A's cache: the whole shared prompt where the cache can be cut
# back to it, the end-of-prompt snapshot (one token short) where it cannot, none where the cache
# kind cannot be kept (a chunked window, a class outside mlx-lm's cache protocol).
REUSE = {"llama4": "none", "deepseek_v41": "none", "gemma2": "shared", "gpt_bigcode": "shared", "mamba": "snapshot"}


@pytest.fixture(scope="module")
def oracle():
    """Every family's greedy answers from one library process, computing while the server starts."""
    answers = Oracle([job(build(f), list(PROMPTS.values()), TOKENS) for f in FAMILIES])
    yield lambda family: dict(zip(PROMPTS, answers.result()[FAMILIES.index(family)]["greedy"]))
    answers.proc.kill()


@pytest.fixture(scope="module")
def vision_oracle():
    """mlx-vlm's own answers for the tiny Gemma 3 and two images, computing from the start."""
    from vision_fixture import tiny_vision
    from vision_oracle import job, start

    path = tiny_vision("gemma3")
    answers = start([job(path, "Describe this.", [(1, 160, 120), (2, 160, 120)], 10)])
    yield path, answers
    answers.close()


@pytest.fixture(scope="module")
def backend(log_dir, oracle, vision_oracle, tmp_path_factory):
    # A cache folder of its own: no verdict of an earlier run (engine/lane_verdicts.py) spares a check.
    env = {"MLX_BACKEND_CACHE_DIR": str(tmp_path_factory.mktemp("solo-cache"))}
    started = serving(log_dir / "solo.log", build("gemma2"), env=env)
    server = next(started)
    server.serving = (build("gemma2"), (), ())  # what serve() compares
    yield server
    next(started, None)  # stops it


def serve(backend, path: str, *options: str, **fields) -> None:
    """`path` loaded with `options`, unless it already is."""
    key = (path, options, tuple(sorted(fields.items())))
    if backend.serving != key:
        result = backend.load(path, Options=list(options), **fields)
        assert result.success, result.message
        backend.serving = key


def opts(prompt: str, label: str, **fields):
    return backend_pb2.PredictOptions(Prompt=prompt, CorrelationId=label, **{"Tokens": TOKENS, **fields})


def text(reply) -> str:
    return reply.message.decode("utf-8", "replace")


def lanes(backend) -> tuple:
    breakdown = backend.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
    return breakdown["lane_solo"], breakdown["lane_prefill_alone"]


def last_lane_line(log_path) -> str:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [line for line in f if "mlx-backend.engine: lane: " in line][-1]


def cached(log_path, label: str) -> int:
    return int(re.search(r"\((\d+) cached\)", completion_line(log_path, label)).group(1))


def request_id(log_path, label: str) -> int:
    return int(re.search(r"request (\d+) \(", completion_line(log_path, label)).group(1))


def tokens_of(backend, prompt: str) -> int:
    return backend.stub.TokenizeString(backend_pb2.PredictOptions(Prompt=prompt), timeout=30).length


# ---- the lane each cause gets, and the library's text in it ----------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_cause_gets_its_lane_and_the_library_text_alone_and_three_at_once(backend, oracle, log_dir, family):
    serve(backend, build(family))
    solo, alone, words = LANES[family]
    assert lanes(backend) == (solo, alone)
    assert words in last_lane_line(log_dir / "solo.log")
    want, stub = oracle(family), backend.stub

    reply = stub.Predict(opts(A, f"{family}-A"), timeout=120)
    assert agrees(text(reply), want["A"]), (family, text(reply), want["A"])

    together = run_threads([lambda p=p, k=k: stub.Predict(opts(p, f"{family}-at-once-{k}"), timeout=120)
                            for k, p in zip("ABC", (A, B, C))])
    for k, reply in zip("ABC", together):
        assert not isinstance(reply, Exception), (family, k, reply)
        assert agrees(text(reply), want[k]), (family, k, text(reply), want[k])
    if solo:  # one at a time, in the order they reached the engine (its request ids)
        log = log_dir / "solo.log"
        ids = [request_id(log, f"{family}-at-once-{k}") for k in "ABC"]
        with open(log, encoding="utf-8", errors="replace") as f:
            ended = [int(m.group(1)) for line in f for m in [re.search(r"request (\d+) \(" + family + "-at-once-", line)]
                     if m and "completion" in line]
        assert ended == sorted(ids), (family, ended)

    # A prompt extending A: from A's cache as the cache kind allows, and still the library's text.
    reply = stub.Predict(opts(A_MORE, f"{family}-A-more"), timeout=120)
    assert agrees(text(reply), want["A_MORE"]), (family, text(reply), want["A_MORE"])
    served = cached(log_dir / "solo.log", f"{family}-A-more")
    shared = tokens_of(backend, A)
    assert served == {"none": 0, "shared": shared, "snapshot": shared - 1}[REUSE[family]], (family, served, shared)


def test_a_recurrent_state_in_the_solo_lane_is_served_from_its_snapshots(backend, oracle, log_dir):
    # mamba runs in the batch (prefilled alone); lane:solo puts it in the solo lane, where its
    # state, which cannot be cut back, is kept at the end of each prompt's prefill.
    serve(backend, build("mamba"), "lane:solo")
    assert lanes(backend) == (1, 0)
    assert "solo (load option lane:solo" in last_lane_line(log_dir / "solo.log")
    want = oracle("mamba")
    for name in ("D", "D_MORE"):
        reply = backend.stub.Predict(opts(PROMPTS[name], f"mamba-solo-{name}"), timeout=120)
        assert agrees(text(reply), want[name]), (name, text(reply), want[name])
    assert cached(log_dir / "solo.log", "mamba-solo-D_MORE") == tokens_of(backend, D) - 1


def test_lane_batch_is_refused_for_a_cache_the_batch_cannot_merge(backend):
    path = build("llama4")
    result = backend.load(path, Options=["lane:batch"])
    assert not result.success
    # Named, as every refusal at load is: a host loading several models reads which one.
    assert result.message.startswith(f"{path}: lane:batch cannot serve this model: its ChunkedKVCache cache "
                                     f"cannot be merged"), result.message
    # The model served before still serves.
    assert backend.stub.Predict(opts(A, "after-refusal"), timeout=120).tokens == TOKENS


def test_lane_batch_is_refused_for_a_vision_family_the_batch_cannot_serve(backend):
    from zoo import vision_builder

    # LLaVA-NeXT's embedding step makes more positions than its prompt has tokens: the check at
    # load sends it to the solo lane (the vision matrix serves it there); forced into the batch, refused.
    result = backend.load(vision_builder.build("llava_next"), Options=["lane:batch"])
    assert not result.success
    assert "lane:batch cannot serve this model: the vision batch cannot serve it: its embedding step makes" \
        in result.message, result.message
    assert backend.stub.Predict(opts(A, "after-vision-refusal"), timeout=120).tokens == TOKENS


# ---- the text pipeline, sampling and bounds in the solo lane (gemma2) -------------------------


@pytest.fixture
def gemma2(backend):
    serve(backend, build("gemma2"), "max_waiting:1", ContextSize=256)
    assert lanes(backend) == (1, 0)
    return backend.stub


def test_stop_strings_and_logprobs(gemma2, oracle):
    full = oracle("gemma2")["B"]["text"]
    stop = full.split()[2]  # a word the greedy text reaches
    reply = gemma2.Predict(opts(B, "stop", StopPrompts=[stop]), timeout=120)
    assert text(reply) == full[:full.index(stop)]
    reply = gemma2.Predict(opts(B, "logprobs", Logprobs=1, TopLogprobs=3), timeout=120)
    content = json.loads(reply.logprobs)["content"]
    assert len(content) == reply.tokens == TOKENS
    for entry in content:  # greedy: each token is its step's most likely one
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["id"] == entry["id"] and top[0]["logprob"] == entry["logprob"]
        assert top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]
    assert "".join(e["token"] for e in content) == text(reply)


def test_seeded_sampling_is_reproducible(gemma2):
    def sampled(seed: int) -> str:
        return text(gemma2.Predict(opts(B, f"seed-{seed}", Temperature=1.0, Seed=seed, IgnoreEOS=True),
                                   timeout=120))

    first = sampled(7)
    assert sampled(7) == first
    assert sampled(8) != first  # the seed is used, not a constant


def test_a_json_schema_holds(gemma2):
    # No free whitespace (llguidance's option): a random model would fill a budget with it.
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    reply = gemma2.Predict(chat("Yes or no?", Tokens=40, Metadata={"json_schema": json.dumps(schema)}),
                           timeout=120)
    assert json.loads(text(reply))["answer"] in ("yes", "no"), text(reply)


def first_chunk(stub, options):
    """A stream started and decoding: its call (cancel it to end it)."""
    call = stub.PredictStream(options, timeout=300)
    next(iter(call))
    return call


def test_cancelling_a_stream_frees_the_lane_for_the_next(gemma2):
    generated = gemma2.GetMetrics(backend_pb2.MetricsRequest(), timeout=10).tokens_generated
    running = first_chunk(gemma2, opts(A, "to-cancel", Tokens=400, IgnoreEOS=True))
    running.cancel()
    assert gemma2.Predict(opts(B, "after-cancel"), timeout=120).tokens == TOKENS
    # Counted, not timed: the cancelled request left after a few of its 400 tokens.
    generated = gemma2.GetMetrics(backend_pb2.MetricsRequest(), timeout=10).tokens_generated - generated
    assert generated < 200, f"{generated} tokens generated: the cancelled request kept decoding"


def test_the_queue_bound_and_a_prompt_past_the_context_give_their_codes(gemma2):
    running = first_chunk(gemma2, opts(A, "long", Tokens=400, IgnoreEOS=True))
    try:
        # One runs, one may wait (max_waiting:1): the third is refused at once.
        calls = [gemma2.Predict.future(opts(q, f"queued-{i}", Tokens=3), timeout=300) for i, q in enumerate((B, C))]
        deadline = time.monotonic() + 120  # a liveness bound only
        while not any(c.done() for c in calls):
            assert time.monotonic() < deadline, "neither queued call ended while the stream ran"
            time.sleep(0.05)
        refused = next(c for c in calls if c.done())
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_waiting=1" in refused.details()
    finally:
        running.cancel()
    other = calls[1 - calls.index(refused)]
    assert other.result().tokens == 3
    with pytest.raises(grpc.RpcError) as err:
        gemma2.Predict(opts("word " * 300, "too-long"), timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_health_and_status_answer_while_the_solo_lane_runs(gemma2):
    arrivals = []
    call = gemma2.PredictStream(opts(A, "health", Tokens=400, IgnoreEOS=True), timeout=300)

    def read():
        try:
            for _ in call:
                arrivals.append(time.monotonic())
        except grpc.RpcError:
            pass  # cancelled below

    t = threading.Thread(target=read)
    t.start()
    answered = []  # (tokens arrived so far, state, lane_solo), while the stream runs: it is cancelled after
    deadline = time.monotonic() + 120  # a liveness bound only
    while len({n for n, _, _ in answered}) < 5:
        assert time.monotonic() < deadline and t.is_alive(), (len(arrivals), answered)
        assert gemma2.Health(backend_pb2.HealthMessage(), timeout=10).message == b"OK"
        status = gemma2.Status(backend_pb2.HealthMessage(), timeout=10)
        if arrivals:
            answered.append((len(arrivals), status.state, status.memory.breakdown["lane_solo"]))
        time.sleep(0.02)
    call.cancel()
    t.join()
    # Answered between tokens of the one running request, not after it.
    assert all(state == backend_pb2.StatusResponse.BUSY and solo == 1 for _, state, solo in answered), answered


# ---- a vision family in the batch and in the solo lane -----------------------------------------

# Gemma 3's embedding step builds its own mask from the processor's attention mask, which the
# vision batch hands it (prepare/vision.py): batched, it gives mlx-vlm's tokens, so the check
# keeps the batch. lane:solo puts the same model through mlx-vlm's own generation step.
GEMMA3_LANES = {"": ((0, 0), "batch (batched, it gives the single stream's tokens"),
                "lane:solo": ((1, 0), "solo (load option lane:solo")}


@pytest.mark.parametrize("option", GEMMA3_LANES)
def test_gemma3_vision_gives_mlx_vlm_text_in_its_lane(backend, vision_oracle, log_dir, option):
    from vision_fixture import image_b64

    path, answers = vision_oracle
    serve(backend, path, *filter(None, [option]))
    want = answers.answer(0)["images"]
    lane, words = GEMMA3_LANES[option]
    assert lanes(backend) == lane
    assert words in last_lane_line(log_dir / "solo.log")

    def ask(seed):
        reply = backend.stub.Predict(chat("Describe this.", Images=[image_b64(seed)], Logprobs=1, Tokens=10,
                                          Temperature=0.0), timeout=120)
        return [e["id"] for e in json.loads(reply.logprobs)["content"]]

    assert want[0] != want[1], "the two images should give different text"
    assert ask(1)[:len(want[0])] == want[0]
    for got, expect in zip(run_threads([lambda: ask(1), lambda: ask(2)]), want):
        assert got[:len(expect)] == expect
