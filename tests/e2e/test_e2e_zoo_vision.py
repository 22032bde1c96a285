"""End-to-end: every vision-language family of the installed mlx-vlm gives mlx-vlm's own text.

The families are what the library ships (zoo/vision_families.py); each the builder can make
is a tiny seeded random-weight model (zoo/vision_builder.py). One server serves them in turn
(LoadModel swaps); one oracle process runs mlx-vlm's own greedy generation for all of them
(vision_oracle.py), each family's answer read as soon as it is computed, so the server checks
one family while the oracle computes the next. Per family: an image alone gives the library's
tokens; two requests at once, with pictures of different sizes (so prompts of different
lengths share the batch), each give their alone answer; a stream gives the unary answer; the
same request again (its prompt now cached) gives it once more ("prefix": and some of it came
from the prefix cache where the cache kind allows); a video, where the library takes one for
the family, gives the library's tokens; the library's answers to two pictures of one size
differ ("matters": its image changes its answer, or no comparison here proves anything about
the image path); an omni family (AUDIO_FAMILIES) asked about two clips gives the library's
tokens alone, both at once and streamed. A family whose library generation fails here must be
refused at LoadModel, in the library's words. Each family is one case; the results go to
vision.json (in $ZOO_RESULTS_DIR, else zoo/ in this run's temporary folder), written even when
cases fail. `FAMILIES=a,b` runs only those. In `make test`: every family built, a few
seconds each, but those with a vision tower mlx-vlm fixes at full size (a minute or more a case:
vision_families.FULL_TOWERS), checked with ZOO_FULL_TOWERS=1 (make families-doc) or by name.
Beside them: a folder whose processor cannot see images (mlx-vlm's bare-tokenizer fallback)
is refused at load.
"""

import base64
import json
import os
import re
import shutil

import grpc
import pytest

from audio_clips import clip, wav_bytes
from common.launcher import Backend, backend_pb2, chat
from conftest import completion_line, run_threads
from vision_fixture import image_b64, video_b64
from vision_oracle import job, start
from zoo import vision_builder
from zoo.vision_families import LIBRARY_CANNOT, built_here, reason, vision_families
from zoo.vision_results import Results

pytestmark = pytest.mark.e2e

QUESTION = "Describe this."
N = 12
PICTURES = [(1, 160, 120), (2, 96, 128)]  # (seed, width, height): two sizes, two prompt lengths
# Another picture of the first one's size: the same prompt length, so only the image can change the answer. The
# library's answers to it and to the first must differ, or no comparison proves anything about the image path.
SAME_SIZE = (3, 160, 120)
VIDEO = 3
CLIPS = [(1, 2.0), (2, 3.0)]  # (seed, seconds) of audio_clips.clip: two lengths, two prompt lengths
# Families whose tiny model takes audio as mlx-vlm's generation gives it (an audio tower with weights, a
# template that renders the clip), asked about a clip too. The other omni families' recipes build no audio
# path yet (docs/audio.md says which, and what each would need).
AUDIO_FAMILIES = {"qwen3_omni_moe", "inkling", "gemma4_unified"}
ALL = vision_families()
# Cache kinds whose prefix the vision batch reuses: a cache it can cut back. A window that
# wrapped or a recurrent state (no boundary snapshots in the vision batch yet) and the solo lane
# (no prefix cache for vision) reuse none: exact is all "prefix" asks there, as in the text matrix.
REUSED_KINDS = {"KVCache"}
NAMED = [f for f in os.environ.get("FAMILIES", "").split(",") if f]
WANTED = NAMED or ALL


@pytest.fixture(scope="module")
def server(log_dir):
    """A server with no model yet, starting now (its imports run beside the builder's and the
    oracle's): each family's case loads its own (a family may be refused)."""
    started = Backend(log_path=str(log_dir / "zoo-vision.log"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def zoo(server, tmp_path_factory):
    """{family: its model directory} for the families built here, and the oracle's answers."""
    paths = {f: vision_builder.build(f) for f in WANTED if built_here(f, NAMED)}
    oracle = start([job(p, QUESTION, PICTURES + [SAME_SIZE], N, video=VIDEO, audio=CLIPS if f in AUDIO_FAMILIES else ())
                    for f, p in paths.items()])
    # Beside the text matrix's text.json: the one folder the families document is made from.
    folder = os.environ.get("ZOO_RESULTS_DIR") or str(tmp_path_factory.getbasetemp() / "zoo")
    results = Results(os.path.join(folder, "vision.json"))
    yield paths, lambda family: oracle.answer(list(paths).index(family)), results
    oracle.close()
    results.write()


@pytest.fixture(scope="module")
def backend(server, zoo):
    server.wait_healthy()
    return server


def ids(reply):
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def ask(picture, **fields):
    seed, width, height = picture
    return chat(QUESTION, Images=[image_b64(seed, (width, height))], Logprobs=1, Tokens=N, Temperature=0.0, **fields)


def streamed(stub, request) -> list:
    return [e["id"] for r in stub.PredictStream(request, timeout=300) if r.logprobs
            for e in json.loads(r.logprobs)["content"]]


def lane(stub) -> str:
    return "solo" if stub.Status(backend_pb2.HealthMessage()).memory.breakdown.get("lane_solo") else "batch"


def agrees(got, want) -> bool:
    """Whether served tokens are the library's, up to its last certain step (the oracle's
    answer stops where its top-2 margin fell under 1e-3)."""
    return got[:len(want)] == want


@pytest.mark.parametrize("family", WANTED)
def test_vision_family_serves_the_library_output(backend, zoo, family):
    paths, oracle, results = zoo
    record = results.family(family)
    if family in LIBRARY_CANNOT:  # what the installed library lacks here, read from its source
        record.library_cannot(LIBRARY_CANNOT[family])
        pytest.skip(f"{family}: the library cannot run it here: {LIBRARY_CANNOT[family]}")
    if family not in paths:
        record.not_built(reason(family))
        pytest.skip(f"{family}: not built: {reason(family)}")
    want = oracle(family)
    record.cache_kinds = want.get("cache_kinds", [])
    if want["error"]:  # the library itself cannot run it here: refused at LoadModel, with the reason
        record.library_cannot(want["error"])
        loaded = backend.load(paths[family])
        assert not loaded.success and family in loaded.message, (family, want["error"], loaded.message)
        # In the library's own words (a crash of the oracle's process has none to compare).
        assert want["error"] in loaded.message or "crashed" in want["error"], (want["error"], loaded.message)
        assert backend.stub.Health(backend_pb2.HealthMessage(), timeout=30).message  # and it goes on serving
        return
    assert want["images"][0] != want["images"][1], f"{family}: the two pictures should give different text"
    # Two pictures of one size: only the image differs, so the answers must (shaped so: zoo/vision_builder.py).
    record.check("matters", want["images"][0] != want["images"][2])
    if not record.checks["matters"]:
        record.reason = "its image does not change its answer (two pictures of one size give the same text)"
    loaded = backend.load(paths[family])
    if not loaded.success:
        record.refused(loaded.message)
        pytest.fail(f"{family}: refused at LoadModel: {loaded.message}")
    record.lane = lane(backend.stub)
    stub, seen = backend.stub, {}

    def alone():
        seen["alone"] = [ids(stub.Predict(ask(p), timeout=300)) for p in PICTURES]
        return all(agrees(a, w) for a, w in zip(seen["alone"], want["images"]))

    def batched():
        replies = run_threads([lambda p=p: stub.Predict(ask(p), timeout=300) for p in PICTURES])
        seen["batched"] = [r if isinstance(r, Exception) else ids(r) for r in replies]
        return seen["batched"] == seen["alone"]

    def video():
        clip = chat(QUESTION, Videos=[video_b64(VIDEO)], Logprobs=1, Tokens=N, Temperature=0.0)
        seen["video"] = ids(stub.Predict(clip, timeout=300))
        return agrees(seen["video"], want["video"])

    def again():
        label = f"{family}-again"
        seen["again"] = ids(stub.Predict(ask(PICTURES[1], CorrelationId=label), timeout=300))
        seen["cached"] = int(re.search(r"\((\d+) cached\)", completion_line(backend.log_path, label)).group(1))
        return seen["again"] == seen["alone"][1]

    if checked(record, "alone", alone):
        checked(record, "batched", batched)
        checked(record, "stream", lambda: streamed(stub, ask(PICTURES[0])) == seen["alone"][0])
        # Asked again, its prompt (image included) now in the prefix cache: the same text, and
        # served from the cache where the vision batch promises reuse (REUSED_KINDS).
        if checked(record, "repeat", again):
            promised = record.lane == "batch" and set(record.cache_kinds) <= REUSED_KINDS
            record.check("prefix", seen["cached"] > 0 or not promised)
            if not record.checks["prefix"]:
                record.reason = record.reason or "prefix: nothing of the repeated prompt came from the prefix cache"
    record.check("images", record.checks["alone"] and bool(record.checks["batched"]))
    if want["video"] is not None:  # the library puts the clip in this family's prompt
        checked(record, "video", video)
    if family in AUDIO_FAMILIES:
        assert want.get("audio_error") is None, want["audio_error"]
        heard = want["audio"]
        assert heard[0] != heard[1], f"{family}: the two clips should give different text"

        def hear(i, **fields):
            seed, seconds = CLIPS[i]
            wav = base64.b64encode(wav_bytes(clip(seed, seconds))).decode()
            return chat(QUESTION, Audios=[wav], Logprobs=1, Tokens=N, Temperature=0.0, **fields)

        def audio():
            seen["audio"] = [ids(stub.Predict(hear(i), timeout=300)) for i in range(2)]
            together = run_threads([lambda i=i: stub.Predict(hear(i), timeout=300) for i in range(2)])
            seen["audio_together"] = [r if isinstance(r, Exception) else ids(r) for r in together]
            return (all(agrees(a, w) for a, w in zip(seen["audio"], heard))
                    and seen["audio_together"] == seen["audio"]
                    and streamed(stub, hear(0)) == seen["audio"][0])
        checked(record, "audio", audio)
    failed = [name for name, ok in record.checks.items() if ok is False]
    record.checks.pop("repeat", None)
    assert not failed, f"{family}: {failed} {record.reason} served {seen} library {want}"


def checked(record, name, check) -> bool:
    """Run one check and record its outcome; a gRPC error fails it, its reason recorded."""
    try:
        ok = bool(check())
    except grpc.RpcError as e:
        ok = False
        record.reason = record.reason or f"{name}: {e.code().name}: {e.details()}"
    record.check(name, ok)
    return ok


def test_a_folder_whose_processor_makes_no_image_inputs_is_refused(backend, tmp_path):
    """Granite Vision without its processor files (preprocessor_config.json, processor_config.json):
    mlx-vlm's loader falls back to the bare tokenizer, which makes no pixel values, so the model
    would answer every image request without looking at the image. Refused at LoadModel, saying
    so; the intact folder then serves."""
    built = vision_builder.build("granite_vision")
    broken = tmp_path / "granite_vision-without-preprocessor"
    shutil.copytree(built, broken)
    for name in ("preprocessor_config.json", "processor_config.json"):
        (broken / name).unlink()
    loaded = backend.load(str(broken))
    assert not loaded.success and "no image inputs" in loaded.message, loaded.message
    assert backend.load(built).success
    assert ids(backend.stub.Predict(ask(PICTURES[0]), timeout=300))
