"""End-to-end: audio through the server as LocalAI drives it, its bounds, and how its jobs share the engine.

One backend folder laid out for LocalAI and started as LocalAI starts it (run.sh); models
loaded as LocalAI sends them (a name under its models folder): a tiny Whisper (speech to
text), a tiny KittenTTS (text to speech) and Silero VAD with its real weights (voice
activity), built by the audio matrix's recipes. Each answer is mlx-audio's own (audio_oracle.py,
a separate process): a clip as WAV, FLAC and MP3; a text spoken to a WAV and streamed; the
speech found in samples. Bad input of every kind gets a clear gRPC code and the next normal
request is served; a cancelled transcription leaves at its next turn; a short transcription
sent while a long one runs finishes first, Health answering OK meanwhile.
"""

import base64
import json
import os
import threading
import time

import grpc
import numpy as np
import pytest

import localai_backend
from audio_clips import clip, read_wav, write_wav
from audio_oracle import start
from common.launcher import backend_pb2
from localai_host import start_like_localai, stop_like_localai, wait_healthy_like_the_host
from zoo.audio import builder
from zoo.audio.families import recipes

pytestmark = pytest.mark.e2e

NS = 1_000_000_000
TEXTS = ("Hello there.", "A different sentence, longer.")
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
EXHAUSTED, PRECONDITION = grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION


def _flac(path, samples):
    import soundfile

    soundfile.write(str(path), samples, 16000, format="FLAC", subtype="PCM_16")
    return str(path)


def _mp3(path, samples):
    import lameenc

    encoder = lameenc.Encoder()
    encoder.set_bit_rate(64)
    encoder.set_in_sample_rate(16000)
    encoder.set_channels(1)
    encoder.set_quality(2)
    pcm = (np.clip(samples, -1, 1) * 32767).round().astype("<i2").tobytes()
    with open(path, "wb") as f:
        f.write(encoder.encode(pcm) + encoder.flush())
    return str(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("audio")
    models = base / "models"
    models.mkdir()
    for kind, family in (("stt", "whisper"), ("tts", "kitten_tts"), ("vad", "silero_vad")):
        os.symlink(builder.build(kind, family), models / family)
    samples = clip(1, 2.0)
    files = {"wav": write_wav(base / "one.wav", samples), "flac": _flac(base / "one.flac", samples),
             "mp3": _mp3(base / "one.mp3", samples), "other": write_wav(base / "two.wav", clip(2, 2.0)),
             "long": write_wav(base / "long.wav", clip(3, 120.0))}
    voice = recipes("tts")["kitten_tts"].generate
    oracle = start([
        {"kind": "stt", "model": str(models / "whisper"), "generate": {},
         "inputs": [files["wav"], files["flac"], files["mp3"], files["other"]]},
        {"kind": "tts", "model": str(models / "kitten_tts"), "generate": voice, "inputs": list(TEXTS)},
        {"kind": "vad", "model": str(models / "silero_vad"), "generate": {}, "inputs": [[1, 4.0, 16000]]},
    ])
    yield dict(base=base, models=models, files=files, voice=voice, oracle=oracle)
    oracle.close()


@pytest.fixture(scope="module")
def host(world, log_dir):
    folder = localai_backend.layout(str(world["base"] / "backends"))
    proc, channel, stub = start_like_localai(folder, log_dir / "audio-host.log")
    try:
        wait_healthy_like_the_host(stub, proc)
        yield stub
    finally:
        channel.close()
        stop_like_localai(proc)


def load_as_localai(stub, world, family, options=()):
    models = world["models"]
    result = stub.LoadModel(backend_pb2.ModelOptions(Model=family, ModelFile=str(models / family),
                                                     ModelPath=str(models), Options=list(options)), timeout=300)
    assert result.success, result.message
    return family


def transcribe(stub, path, **fields):
    return stub.AudioTranscription(backend_pb2.TranscriptRequest(dst=path, threads=4, **fields), timeout=600)


def same_transcript(got, want) -> bool:
    return got.text == want["text"] and [(s.text, s.start, s.end) for s in got.segments] == [
        (w["text"], round(w["start"] * NS), round(w["end"] * NS)) for w in want["segments"]]


def refused(code, call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, (e.value.code(), e.value.details())
    return e.value.details()


# ---- the three kinds, as the host sends them ---------------------------------------------------


def test_transcription_of_wav_flac_and_mp3_is_the_librarys(host, world):
    name = load_as_localai(host, world, "whisper")
    want = world["oracle"].answer(0)
    assert want["error"] is None, want["error"]
    files = world["files"]
    for i, kind in enumerate(("wav", "flac", "mp3")):
        got = transcribe(host, files[kind], ModelIdentity=name)
        assert same_transcript(got, want["outputs"][i]), (kind, got, want["outputs"][i])
        assert got.duration == pytest.approx(2.0, abs=0.15) and got.language == (want["outputs"][i]["language"] or "")
    assert transcribe(host, files["other"]).text == want["outputs"][3]["text"] != want["outputs"][0]["text"]
    status = dict(host.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown)
    assert status["audio_stt"] == 1 and status["audio_sample_rate"] == 16000


def test_speech_written_and_streamed_is_the_librarys(host, world, tmp_path):
    name = load_as_localai(host, world, "kitten_tts")
    want = world["oracle"].answer(1)
    assert want["error"] is None, want["error"]
    voice = world["voice"].get("voice", "")
    for i, text in enumerate(TEXTS):
        dst = tmp_path / f"tts-{i}.wav"
        # LocalAI's TTSRequest: `model` is the model's path (it joins its models folder), dst a file to write.
        result = host.TTS(backend_pb2.TTSRequest(text=text, model=str(world["models"] / name), dst=str(dst),
                                                 voice=voice, ModelIdentity=name), timeout=600)
        assert result.success, result.message
        samples, rate = read_wav(dst)
        ref = np.frombuffer(base64.b64decode(want["outputs"][i]["audio"]), dtype="<f4")
        assert rate == want["outputs"][i]["sample_rate"] and samples.shape == ref.shape
        assert np.max(np.abs(samples - np.clip(ref, -1, 1))) <= 1.01 / 32767
    replies = list(host.TTSStream(backend_pb2.TTSRequest(text=TEXTS[0], voice=voice), timeout=600))
    assert json.loads(replies[0].message) == {"sample_rate": want["outputs"][0]["sample_rate"]}
    streamed = np.frombuffer(b"".join(r.audio for r in replies[1:]), dtype="<i2").astype(np.float32) / 32767
    assert np.array_equal(streamed, read_wav(tmp_path / "tts-0.wav")[0])


def test_voice_activity_is_the_librarys(host, world):
    load_as_localai(host, world, "silero_vad")
    want = world["oracle"].answer(2)
    assert want["error"] is None, want["error"]
    reply = host.VAD(backend_pb2.VADRequest(audio=clip(1, 4.0).tolist()), timeout=120)
    got = [[s.start, s.end] for s in reply.segments]
    assert len(got) == len(want["outputs"][0]["segments"]) > 0
    np.testing.assert_allclose(got, want["outputs"][0]["segments"], rtol=1e-6)


# ---- bad input: a clear code each, and the server goes on ----------------------------------


def test_bad_transcriptions_are_refused_clearly(host, world, tmp_path):
    load_as_localai(host, world, "whisper", ["audio_max_bytes:200000", "audio_max_seconds:60"])
    (tmp_path / "not-audio.wav").write_text("this is a text file, not audio")
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "tune.ogg").write_bytes(b"OggS" + bytes(200))
    assert "no file" in refused(NOT_FOUND, lambda: transcribe(host, str(tmp_path / "missing.wav")))
    assert "not audio" in refused(INVALID, lambda: transcribe(host, str(tmp_path / "not-audio.wav")))
    assert "not audio" in refused(INVALID, lambda: transcribe(host, str(tmp_path / "empty.wav")))
    assert "ffmpeg" in refused(INVALID, lambda: transcribe(host, str(tmp_path / "tune.ogg")))
    assert "dst: empty" in refused(INVALID, lambda: transcribe(host, ""))
    assert "a file" in refused(INVALID, lambda: transcribe(host, str(tmp_path)))
    big = write_wav(tmp_path / "big.wav", clip(4, 7.0))  # 224 KB: over the byte bound
    assert "audio_max_bytes" in refused(EXHAUSTED, lambda: transcribe(host, big))
    assert "diarization" in refused(INVALID, lambda: transcribe(host, world["files"]["wav"], diarize=True))
    assert "granularities" in refused(INVALID, lambda: transcribe(
        host, world["files"]["wav"], timestamp_granularities=["syllable"]))
    assert "speech-to-text" in refused(PRECONDITION, lambda: host.VAD(backend_pb2.VADRequest(audio=[0.0]), timeout=30))
    assert "speech-to-text" in refused(PRECONDITION, lambda: host.Predict(
        backend_pb2.PredictOptions(Prompt="hi"), timeout=30))
    load_as_localai(host, world, "whisper", ["audio_max_seconds:60"])
    assert "audio_max_seconds" in refused(EXHAUSTED, lambda: transcribe(host, world["files"]["long"]))
    want = world["oracle"].answer(0)["outputs"][0]
    assert same_transcript(transcribe(host, world["files"]["wav"]), want)


def test_bad_speech_and_samples_are_refused_clearly(host, world, tmp_path):
    load_as_localai(host, world, "kitten_tts", ["tts_max_chars:40"])
    voice = world["voice"].get("voice", "")

    def speak(text, **fields):
        fields.setdefault("voice", voice)
        return host.TTS(backend_pb2.TTSRequest(text=text, dst=str(tmp_path / "out.wav"), **fields), timeout=120)

    assert "text: empty" in refused(INVALID, lambda: speak("   "))
    assert "tts_max_chars" in refused(EXHAUSTED, lambda: speak("word " * 20))
    assert "voice" in refused(INVALID, lambda: speak("Hello.", voice="no-such-voice"))
    assert "folder" in refused(INVALID, lambda: host.TTS(backend_pb2.TTSRequest(
        text="Hello.", dst=str(tmp_path / "missing" / "out.wav"), voice=voice), timeout=30))
    assert "speed" in refused(INVALID, lambda: speak("Hello.", params={"speed": "0"}))
    assert "takes no" in refused(INVALID, lambda: speak("Hello.", params={"no_such_option": "1"}))
    assert "text-to-speech" in refused(PRECONDITION, lambda: transcribe(host, world["files"]["wav"]))
    assert speak(TEXTS[0]).success
    bad = host.LoadModel(backend_pb2.ModelOptions(Model=str(world["models"] / "silero_vad"),
                                                  Options=["vad_sample_rate:0"]), timeout=60)
    assert not bad.success and "vad_sample_rate" in bad.message
    load_as_localai(host, world, "silero_vad", ["vad_max_seconds:2"])
    assert "no samples" in refused(INVALID, lambda: host.VAD(backend_pb2.VADRequest(audio=[]), timeout=30))
    assert "finite" in refused(INVALID, lambda: host.VAD(backend_pb2.VADRequest(audio=[0.0, float("nan")]), timeout=30))
    assert "vad_max_seconds" in refused(EXHAUSTED, lambda: host.VAD(
        backend_pb2.VADRequest(audio=clip(1, 3.0).tolist()), timeout=30))
    assert host.VAD(backend_pb2.VADRequest(audio=clip(1, 1.5).tolist()), timeout=30) is not None


# ---- how audio jobs share the engine ------------------------------------------------------


def test_a_short_transcription_is_not_stuck_behind_a_long_one(host, world):
    load_as_localai(host, world, "whisper")
    finished, health = {}, []

    def run(name, path):
        transcribe(host, path)
        finished[name] = time.monotonic()

    long = threading.Thread(target=run, args=("long", world["files"]["long"]))
    long.start()
    time.sleep(0.3)  # the long one is running
    short = threading.Thread(target=run, args=("short", world["files"]["wav"]))
    short.start()
    while long.is_alive():
        health.append(host.Health(backend_pb2.HealthMessage(), timeout=10).message)
        time.sleep(0.2)
    short.join()
    assert finished["short"] < finished["long"], finished
    assert health and set(health) == {b"OK"}


def test_a_cancelled_transcription_leaves_and_the_next_is_served(host, world):
    load_as_localai(host, world, "whisper")
    with pytest.raises(grpc.RpcError) as e:
        host.AudioTranscription(backend_pb2.TranscriptRequest(dst=world["files"]["long"]), timeout=0.5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # it leaves at its next turn
        status = dict(host.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown)
        if status.get("audio_jobs_running") == 0:
            break
        time.sleep(0.1)
    assert status["audio_jobs_running"] == 0
    want = world["oracle"].answer(0)["outputs"][0]
    assert same_transcript(transcribe(host, world["files"]["wav"]), want)


# ---- audio in a chat, for an omni model -----------------------------------------------------


def test_audio_in_a_chat_is_placed_bounded_and_refused_where_it_cannot_go(host, world, tmp_path):
    from zoo import vision_builder
    from vision_fixture import image_b64, tiny_qwen2_vl

    omni = vision_builder.build("qwen3_omni_moe")
    loaded = host.LoadModel(backend_pb2.ModelOptions(Model=omni, Options=["audio_max_seconds:10"]), timeout=300)
    assert loaded.success, loaded.message
    wav = base64.b64encode(open(world["files"]["wav"], "rb").read()).decode()
    mp3 = base64.b64encode(open(world["files"]["mp3"], "rb").read()).decode()
    meta = host.ModelMetadata(backend_pb2.ModelOptions(), timeout=30)

    def ask(**fields):
        fields.setdefault("Tokens", 4)
        return host.Predict(backend_pb2.PredictOptions(**fields), timeout=300)

    chat_turn = [backend_pb2.Message(role="user", content="What do you hear?")]
    for clip_b64 in (wav, mp3):
        assert ask(Messages=chat_turn, UseTokenizerTemplate=True, Audios=[clip_b64]).tokens > 0
    # A raw prompt: the host's marker for each clip.
    assert ask(Prompt=f"Listen: {meta.media_marker} What is it?", Audios=[wav]).tokens > 0
    assert "marker" in refused(INVALID, lambda: ask(Prompt="No marker here.", Audios=[wav]))
    assert "which is which" in refused(INVALID, lambda: ask(
        Prompt=f"{meta.media_marker} and {meta.media_marker}", Audios=[wav], Images=[image_b64(1)]))
    not_audio = base64.b64encode(b"plain text, not a sound").decode()
    assert "not audio" in refused(INVALID, lambda: ask(Messages=chat_turn, UseTokenizerTemplate=True,
                                                        Audios=[not_audio]))
    long = base64.b64encode(open(world["files"]["long"], "rb").read()).decode()
    assert "audio_max_seconds" in refused(EXHAUSTED, lambda: ask(Messages=chat_turn, UseTokenizerTemplate=True,
                                                                  Audios=[long]))
    assert ask(Messages=chat_turn, UseTokenizerTemplate=True, Audios=[wav]).tokens > 0
    loaded = host.LoadModel(backend_pb2.ModelOptions(Model=tiny_qwen2_vl()), timeout=300)
    assert loaded.success, loaded.message
    assert "does not take audio" in refused(INVALID, lambda: ask(Messages=chat_turn, UseTokenizerTemplate=True,
                                                                  Audios=[wav]))
