"""End-to-end: every audio family of the installed mlx-audio gives mlx-audio's own output.

The families are what the library ships (zoo/audio/families.py: speech to text, text to
speech, voice activity); each one a recipe makes is a tiny seeded model built with the
library's own classes, shaped so its input matters (zoo/audio/builder.py). One server serves
them in turn (LoadModel swaps); one oracle process runs mlx-audio's own generation for all of
them (audio_oracle.py), each family's answer read as soon as it is computed. Per family:
- stt: each of two clips, as a WAV file, transcribed alone gives the library's text and
  segments (times to the nanosecond LocalAI reads, where the family's times are the audio's);
  both at once give the same; AudioTranscriptionStream's final result is the unary one.
- tts: each of two texts spoken alone gives the library's waveform (within 16-bit PCM's step:
  the WAV is what the host gets) at the model's own sample rate; both at once the same;
  TTSStream's header says that rate and its chunks are the same samples.
- vad: each of two clips' samples gives the library's segments; both at once the same.
A family whose own generation fails here must be refused at LoadModel or fail its requests
with the library's words. The results go to audio.json (in $ZOO_RESULTS_DIR, else zoo/ in
this run's temporary folder), written even when cases fail. `FAMILIES=family,kind:family,...`
runs only those.
"""

import base64
import json
import os
import wave

import grpc
import numpy as np
import pytest

from audio_clips import clip, read_wav, write_wav
from audio_oracle import start
from common.launcher import Backend, backend_pb2
from conftest import run_threads
from zoo.audio import builder
from zoo.audio.families import KINDS, audio_families, reason, recipes

pytestmark = pytest.mark.e2e

ALL = [(k, f) for k in KINDS for f in audio_families(k)]
# FAMILIES=whisper,tts:kokoro: by name (of any kind) or kind:name; set without an audio family, none of them.
NAMED = {x.strip() for x in os.environ.get("FAMILIES", "").split(",") if x.strip()}
WANTED = [(k, f) for k, f in ALL if f in NAMED or f"{k}:{f}" in NAMED] if NAMED else ALL
NS = 1_000_000_000
PCM_STEP = 1.0 / 32767.0
# Families whose segment times are not times in the audio (they report the wall time their
# generation took: mlx-audio's qwen2_audio and higgs_audio_3): their text is compared, not their times.
WALL_TIMES = {"qwen2_audio", "higgs_audio_3"}


# ---- how a recipe's generate keywords reach the server: request fields and load options ----

STT_FIELDS = {"language": "language", "initial_prompt": "prompt", "prompt": "prompt", "context": "prompt",
              "system_prompt": "prompt", "text": "prompt"}


def stt_request(kwargs: dict, path: str) -> "backend_pb2.TranscriptRequest":
    fields = {"dst": path}
    for key, value in kwargs.items():
        if key == "max_tokens":
            continue  # a load option (options_for)
        if key == "task":
            assert value == "translate", kwargs
            fields["translate"] = True
        elif key == "temperature":
            fields["temperature"] = float(value)
        else:
            assert key in STT_FIELDS, f"the recipe's keyword {key} has no request field"
            fields[STT_FIELDS[key]] = value
    return backend_pb2.TranscriptRequest(**fields)


def tts_request(kwargs: dict, text: str, dst: str = "") -> "backend_pb2.TTSRequest":
    fields, params = {"text": text, "dst": dst}, {}
    for key, value in kwargs.items():
        if key == "voice":
            fields["voice"] = value
        elif key == "lang_code":
            fields["language"] = value
        elif key == "instruct":
            fields["instructions"] = value
        else:  # the family's own keywords travel in params, as strings (LocalAI's map<string, string>)
            params[key] = str(value)
    return backend_pb2.TTSRequest(params=params, **fields)


def options_for(kind: str, kwargs: dict) -> list:
    return [f"max_tokens:{kwargs['max_tokens']}"] if kind == "stt" and "max_tokens" in kwargs else []


# ---- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(log_dir):
    started = Backend(log_path=str(log_dir / "zoo-audio.log"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Each (seed, seconds) clip a recipe asks for, written as a 16 kHz WAV."""
    folder = tmp_path_factory.mktemp("clips")
    paths = {}
    for kind, family in WANTED:
        recipe = recipes(kind).get(family)
        for seed, seconds in (recipe.inputs if recipe and kind != "tts" else ()):
            paths.setdefault((seed, seconds), write_wav(folder / f"clip-{seed}-{seconds}.wav", clip(seed, seconds)))
    return paths


def _oracle_inputs(kind, recipe, clips):
    if kind == "stt":
        return [clips[tuple(i)] for i in recipe.inputs]
    if kind == "vad":
        return [[seed, seconds, 16000] for seed, seconds in recipe.inputs]
    return list(recipe.inputs)


@pytest.fixture(scope="module")
def zoo(server, clips, tmp_path_factory):
    """{(kind, family): its model folder} for the families built here, and the oracle's answers."""
    built = {}
    for kind, family in WANTED:
        if family in recipes(kind):
            built[(kind, family)] = builder.build(kind, family)
    jobs = [{"kind": kind, "model": path, "inputs": _oracle_inputs(kind, recipes(kind)[family], clips),
             "generate": recipes(kind)[family].generate} for (kind, family), path in built.items()]
    oracle = start(jobs)
    folder = os.environ.get("ZOO_RESULTS_DIR") or str(tmp_path_factory.getbasetemp() / "zoo")
    os.makedirs(folder, exist_ok=True)
    results = {}
    yield built, lambda key: oracle.answer(list(built).index(key)), results
    oracle.close()
    path = os.path.join(folder, "audio.json")
    try:
        with open(path) as f:
            kept = json.load(f).get("families", {})
    except (OSError, ValueError):
        kept = {}
    from importlib import metadata

    kept.update(results)
    with open(path, "w") as f:
        json.dump({"library": f"mlx-audio {metadata.version('mlx-audio')}", "families": kept}, f, indent=1)


@pytest.fixture(scope="module")
def backend(server, zoo):
    server.wait_healthy()
    return server


# ---- comparisons ---------------------------------------------------------------------------


def same_transcript(got, want: dict, family: str) -> bool:
    if got.text != want["text"].strip() and got.text != want["text"]:
        return False
    if len(got.segments) != len(want["segments"]):
        return False
    for g, w in zip(got.segments, want["segments"]):
        if g.text != str(w["text"]):
            return False
        if family not in WALL_TIMES and w["start"] is not None:
            if abs(g.start - w["start"] * NS) > 1 or abs(g.end - w["end"] * NS) > 1:
                return False
    return True


def waveform(want: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(want["audio"]), dtype="<f4")


def same_speech(samples: np.ndarray, rate: int, want: dict) -> bool:
    ref = waveform(want)
    if rate != want["sample_rate"] or samples.shape != ref.shape:
        return False
    # The WAV holds 16-bit PCM: each sample within one step of the library's float (clipped to [-1, 1]).
    return bool(np.all(np.abs(samples - np.clip(ref, -1, 1)) <= PCM_STEP * 1.01))


def _wav(path: str):
    samples, rate = read_wav(path)
    with wave.open(path, "rb") as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
    return samples, rate


def _record(results, kind, family, **fields):
    results.setdefault(family, {"kind": kind, "status": "served", "reason": "", "checks": {}}).update(fields)
    return results[family]


# ---- the matrix --------------------------------------------------------------------------


@pytest.mark.parametrize("kind, family", WANTED, ids=[f"{k}:{f}" for k, f in WANTED])
def test_audio_family_serves_the_library_output(backend, zoo, clips, tmp_path, kind, family):
    built, oracle, results = zoo
    if (kind, family) not in built:
        _record(results, kind, family, status="not-built", reason=reason(kind, family))
        pytest.skip(f"{kind}:{family}: not built: {reason(kind, family)}")
    recipe = recipes(kind)[family]
    record = _record(results, kind, family, note=recipe.note)
    want = oracle((kind, family))
    loaded = backend.load(built[(kind, family)], Options=options_for(kind, recipe.generate))
    if want["error"]:  # the library cannot run it here: refused at load, or each request fails, in its words
        record.update(status="library-cannot", reason=want["error"])
        if loaded.success:
            with pytest.raises(grpc.RpcError):
                _serve_one(backend.stub, kind, recipe, clips, tmp_path, 0)
        assert backend.stub.Health(backend_pb2.HealthMessage(), timeout=30).message == b"OK"
        return
    assert loaded.success, f"{family}: refused at LoadModel: {loaded.message}"
    outs = want["outputs"]
    assert len(outs) == 2 and outs[0] != outs[1], f"{family}: the two inputs should give two outputs"
    stub, checks = backend.stub, record["checks"]
    status = dict(stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown)
    assert status.get(f"audio_{kind}") == 1, status
    alone = [_serve_one(stub, kind, recipe, clips, tmp_path, i) for i in range(2)]
    checks["alone"] = all(_same(kind, family, got, w) for got, w in zip(alone, outs))
    together = run_threads([lambda i=i: _serve_one(stub, kind, recipe, clips, tmp_path, i, tag="t")
                            for i in range(2)])
    checks["together"] = all(not isinstance(g, Exception) and _same(kind, family, g, w)
                             for g, w in zip(together, outs))
    if kind != "vad":
        checks["stream"] = _streamed_equals(stub, kind, family, recipe, clips, outs[0], alone[0])
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        record.update(status="differs", reason=f"{', '.join(failed)} differ from mlx-audio's own output")
    assert not failed, f"{kind}:{family}: {failed}: served {alone} library {outs}"


def _serve_one(stub, kind, recipe, clips, tmp_path, i, tag=""):
    if kind == "stt":
        return stub.AudioTranscription(stt_request(recipe.generate, clips[tuple(recipe.inputs[i])]), timeout=600)
    if kind == "tts":
        dst = str(tmp_path / f"speech-{i}{tag}.wav")
        result = stub.TTS(tts_request(recipe.generate, recipe.inputs[i], dst), timeout=600)
        assert result.success, result.message
        return _wav(dst)
    seed, seconds = recipe.inputs[i]
    reply = stub.VAD(backend_pb2.VADRequest(audio=clip(seed, seconds).tolist()), timeout=600)
    return [[s.start, s.end] for s in reply.segments]


def _same(kind, family, got, want) -> bool:
    if kind == "stt":
        return same_transcript(got, want, family)
    if kind == "tts":
        return same_speech(got[0], got[1], want)
    return len(got) == len(want["segments"]) and all(
        abs(a - c) <= 1e-6 * max(1.0, abs(c)) and abs(b - d) <= 1e-6 * max(1.0, abs(d))
        for (a, b), (c, d) in zip(got, want["segments"]))


def _streamed_equals(stub, kind, family, recipe, clips, want, unary) -> bool:
    if kind == "stt":
        replies = list(stub.AudioTranscriptionStream(stt_request(recipe.generate, clips[tuple(recipe.inputs[0])]),
                                                     timeout=600))
        final = replies[-1].final_result
        if family in WALL_TIMES:  # its times are how long each call took: the rest must agree
            for result in (final, unary):
                for segment in result.segments:
                    segment.start = segment.end = 0
        deltas = "".join(r.delta for r in replies[:-1])
        return final == unary and (deltas.strip() != "" or final.text == "")
    replies = list(stub.TTSStream(tts_request(recipe.generate, recipe.inputs[0]), timeout=600))
    header = json.loads(replies[0].message)
    pcm = b"".join(r.audio for r in replies[1:])
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767.0
    return header["sample_rate"] == want["sample_rate"] and same_speech(samples, header["sample_rate"], want) \
        and np.array_equal(samples, unary[0])
