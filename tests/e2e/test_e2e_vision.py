"""End-to-end: image requests to a (tiny, random-weight) Qwen2-VL model through the real server.

The oracle is mlx-vlm's own `stream_generate`, greedy, on the same image and
prompt, run in this test process: the server must give the same tokens alone,
in a batch of image requests, and next to text-only requests.
"""

import base64
import io
import json
import time
from pathlib import Path

import grpc
import pytest

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving
from vision_fixture import image_b64, tiny_qwen2_vl, video_b64

pytestmark = pytest.mark.e2e

QUESTION = "Describe this."
N = 10
MAX_PIXELS = 100_000  # the server's max_image_pixels option in these tests
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def model_dir():
    return tiny_qwen2_vl()


@pytest.fixture(scope="module")
def vstub(log_dir, model_dir):
    yield from serving(log_dir / "vision.log", model_dir, Options=[f"max_image_pixels:{MAX_PIXELS}"])


@pytest.fixture(scope="module")
def stub(vstub):
    return vstub.stub


@pytest.fixture(scope="module")
def reference(model_dir):
    """mlx-vlm's greedy tokens for (question, image seed), computed in this process."""
    from PIL import Image
    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    model, processor = load(model_dir)
    memo = {}

    def tokens(seed, question=QUESTION):
        if (seed, question) not in memo:
            images = [] if seed is None else [
                Image.open(io.BytesIO(base64.b64decode(image_b64(seed)))).convert("RGB")]
            prompt = apply_chat_template(processor, model.config, question, num_images=len(images))
            out = [r.token for r in stream_generate(model, processor, prompt, image=images or None,
                                                    max_tokens=N + 2, temperature=0.0)]
            memo[(seed, question)] = out[:N]
        return memo[(seed, question)]

    return tokens


def image_chat(seed, question=QUESTION, **fields):
    fields.setdefault("Tokens", N)
    fields.setdefault("Temperature", 0.0)
    return chat(question, Images=[image_b64(seed)], Logprobs=1, **fields)


def ids(reply):
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def stream(stub, opts):
    chunks = list(stub.PredictStream(opts, timeout=120))
    return b"".join(c.message for c in chunks), chunks[-1]


def prefilled(stub):
    return stub.GetMetrics(backend_pb2.MetricsRequest(), timeout=5).prompt_tokens_processed


def test_image_request_equals_mlx_vlm(stub, reference):
    reply = stub.Predict(image_chat(1), timeout=120)
    assert ids(reply) == reference(1)
    assert reply.tokens == N


def test_a_different_image_changes_the_output_and_never_reuses_the_other_ones_cache(stub, reference):
    assert reference(1) != reference(2)  # the fixture's model really looks at the picture
    stub.Predict(image_chat(1), timeout=120)  # image 1's prompt is now cached
    before = prefilled(stub)
    reply = stub.Predict(image_chat(2), timeout=120)
    assert ids(reply) == reference(2)
    # Only the text before the image was reused: the image and everything after it was prefilled.
    image_tokens = 12  # a 160x120 picture at max_pixels 12544
    assert prefilled(stub) - before > image_tokens


def test_repeated_image_and_prompt_is_served_from_the_prefix_cache(stub, reference):
    stub.Predict(image_chat(3), timeout=120)
    before = prefilled(stub)
    reply = stub.Predict(image_chat(3), timeout=120)
    assert prefilled(stub) - before == 1  # only the last prompt token is recomputed
    assert ids(reply) == reference(3)


def test_raw_prompt_with_media_marker(stub, reference):
    meta = stub.ModelMetadata(backend_pb2.ModelOptions(), timeout=30)
    assert meta.media_marker == "<__media__>"
    prompt = f"<|im_start|>user\n{QUESTION}{meta.media_marker}<|im_end|>\n<|im_start|>assistant\n"
    opts = backend_pb2.PredictOptions(Prompt=prompt, Images=[image_b64(1)], Tokens=N, Temperature=0.0, Logprobs=1)
    assert ids(stub.Predict(opts, timeout=120)) == reference(1)


def test_concurrent_image_requests_and_a_text_request_equal_each_alone(stub, reference):
    text_opts = chat("Count: 1, 2, 3,", Tokens=N, Temperature=0.0, Logprobs=1)
    text_alone = stub.Predict(text_opts, timeout=120)
    assert ids(text_alone) == reference(None, "Count: 1, 2, 3,")  # a vision model serves text-only chat
    seeds = [4, 5, 6]
    together = run_threads([lambda s=s: stub.Predict(image_chat(s), timeout=120) for s in seeds]
                           + [lambda: stub.Predict(text_opts, timeout=120)])
    for s, reply in zip(seeds, together):
        assert ids(reply) == reference(s)
    assert together[-1].message == text_alone.message


def test_forward_work_to_a_vision_model_is_refused_by_name(stub):
    with pytest.raises(grpc.RpcError) as e:
        stub.Embedding(backend_pb2.PredictOptions(Embeddings="a sentence"), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "vision model" in e.value.details()


def test_predict_equals_the_aggregated_stream(stub):
    opts = image_chat(7)
    reply = stub.Predict(opts, timeout=120)
    text, last = stream(stub, opts)
    assert text == reply.message
    assert last.tokens == reply.tokens and last.prompt_tokens == reply.prompt_tokens


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(stub):
    seeded = image_chat(8, Temperature=0.9, Seed=1234, TopK=50, Tokens=12)
    alone = stub.Predict(seeded, timeout=120).message
    assert stub.Predict(seeded, timeout=120).message == alone
    others = [image_chat(9, Temperature=0.9, Seed=5), chat("Hello world!", Tokens=12, Temperature=0.7, Seed=6)]
    together = run_threads([lambda o=o: stub.Predict(o, timeout=120) for o in [seeded] + others])
    assert together[0].message == alone
    other_seed = image_chat(8, Temperature=0.9, Seed=4321, TopK=50, Tokens=12)
    assert stub.Predict(other_seed, timeout=120).message != alone


def test_tokenize_counts_the_expanded_image_tokens(stub, model_dir):
    from PIL import Image
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import load_config, load_processor, prepare_inputs

    # The processor's own expansion of the image is the oracle.
    processor = load_processor(Path(model_dir))
    config = load_config(model_dir)
    prompt = apply_chat_template(processor, config, QUESTION, num_images=1)
    img = Image.open(io.BytesIO(base64.b64decode(image_b64(1)))).convert("RGB")
    expected = prepare_inputs(processor, images=[img], prompts=prompt)["input_ids"].tolist()[0]
    reply = stub.TokenizeString(image_chat(1), timeout=30)
    assert list(reply.tokens) == expected
    text_only = stub.TokenizeString(chat(QUESTION), timeout=30)
    assert reply.length > text_only.length + 12 - 1


def _too_large() -> str:
    return image_b64(1, size=(400, 300))  # 120000 pixels > MAX_PIXELS


BAD = [
    ("bad base64", dict(Images=["not base64!!"]), "Images[0]"),
    ("not an image", dict(Images=[base64.b64encode(b"hello, not a picture").decode()]), "Images[0]"),
    ("too large", dict(Images=[_too_large()]), "Images[0]"),
    ("second item bad", dict(Images=["@@"]), "Images[0]"),
    ("bad video", dict(Videos=[base64.b64encode(b"not a video at all" * 40).decode()]), "Videos[0]"),
    ("audio", dict(Audios=[base64.b64encode(b"RIFF....WAVE").decode()]), "Audios"),
]


@pytest.mark.parametrize("rpc", ["Predict", "PredictStream"])
def test_bad_media_is_invalid_argument_and_the_server_keeps_serving(stub, reference, rpc):
    cases = [(name, chat(QUESTION, Tokens=4, **fields), where) for name, fields, where in BAD]
    cases.append(("second of two bad", chat(QUESTION, Tokens=4, Images=[image_b64(1), "@@"]), "Images[1]"))
    prompt = "<|im_start|>user\n<__media__><__media__><|im_end|>\n<|im_start|>assistant\n"
    cases.append(("two markers one image",
                  backend_pb2.PredictOptions(Prompt=prompt, Images=[image_b64(1)], Tokens=4), "marker"))
    cases.append(("marker without image", backend_pb2.PredictOptions(Prompt=prompt, Tokens=4), "marker"))
    cases.append(("video marker without video",
                  backend_pb2.PredictOptions(Prompt="[vid-0] Describe.", Tokens=4), "marker"))
    for name, opts, where in cases:
        with pytest.raises(grpc.RpcError) as err:
            if rpc == "Predict":
                stub.Predict(opts, timeout=60)
            else:
                list(stub.PredictStream(opts, timeout=60))
        assert err.value.code() == INVALID, name
        assert where in err.value.details(), (name, err.value.details())
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
    assert ids(stub.Predict(image_chat(1), timeout=120)) == reference(1)


def test_a_cancelled_image_stream_leaves_the_batch_and_the_next_request_is_exact(stub, reference):
    call = stub.PredictStream(image_chat(10, Tokens=400), timeout=120)
    next(call)
    next(call)
    call.cancel()
    Status = backend_pb2.StatusResponse.State
    for _ in range(200):
        if stub.Status(backend_pb2.HealthMessage(), timeout=5).state == Status.READY:
            break
        time.sleep(0.05)
    assert stub.Status(backend_pb2.HealthMessage(), timeout=5).state == Status.READY
    assert ids(stub.Predict(image_chat(10), timeout=120)) == reference(10)


@pytest.fixture(scope="module")
def video_reference(model_dir):
    """mlx-vlm's greedy tokens for a clip (its own chat templating and frame sampling)."""
    import os
    import tempfile

    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    model, processor = load(model_dir)

    def tokens(seed):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "clip.mp4")
            with open(path, "wb") as f:
                f.write(base64.b64decode(video_b64(seed)))
            prompt = apply_chat_template(processor, model.config, QUESTION, video=path)
            out = [r.token for r in stream_generate(model, processor, prompt, video=[path],
                                                    max_tokens=N + 2, temperature=0.0)]
        return out[:N]

    return tokens


def test_video_request_equals_mlx_vlm_by_chat_and_by_marker_and_repeats_warm(stub, video_reference):
    expected = video_reference(1)
    assert expected != video_reference(2)
    opts = chat(QUESTION, Videos=[video_b64(1)], Tokens=N, Temperature=0.0, Logprobs=1)
    assert ids(stub.Predict(opts, timeout=120)) == expected
    before = prefilled(stub)
    assert ids(stub.Predict(opts, timeout=120)) == expected
    assert prefilled(stub) - before == 1
    prompt = f"<|im_start|>user\n[vid-0]{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    raw = backend_pb2.PredictOptions(Prompt=prompt, Videos=[video_b64(2)], Tokens=N, Temperature=0.0, Logprobs=1)
    assert ids(stub.Predict(raw, timeout=120)) == video_reference(2)


def test_a_grammar_constrains_an_image_request_next_to_an_unconstrained_one(stub, reference):
    constrained = image_chat(11, Grammar='root ::= ("yes" | "no") "."', Tokens=8)
    free = image_chat(1)
    together = run_threads([lambda: stub.Predict(constrained, timeout=120),
                            lambda: stub.Predict(free, timeout=120)])
    assert together[0].message in (b"yes.", b"no.")
    assert ids(together[1]) == reference(1)


def test_prefill_in_small_chunks_between_decode_steps_stays_exact(vstub, model_dir, reference, video_reference):
    """Chunks of 5 tokens cut through the image tokens; the requests that arrive while
    others decode are prefilled a chunk per step. (Reloads the model: keep this test last.)"""
    stub = vstub.stub
    result = vstub.load(model_dir, Options=[f"max_image_pixels:{MAX_PIXELS}", "prefill_step_size:5"])
    assert result.success, result.message
    seeds = [12, 13, 14]
    together = run_threads([lambda s=s: stub.Predict(image_chat(s), timeout=120) for s in seeds]
                           + [lambda: stub.Predict(chat(QUESTION, Videos=[video_b64(1)], Tokens=N,
                                                        Temperature=0.0, Logprobs=1), timeout=120)])
    for s, reply in zip(seeds, together):
        assert ids(reply) == reference(s)
    assert ids(together[-1]) == video_reference(1)
    assert ids(stub.Predict(image_chat(12), timeout=120)) == reference(12)  # warm, after chunked prefill
