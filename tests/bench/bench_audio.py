#!/usr/bin/env python3
"""`make bench-audio`: audio through our server vs mlx-audio's own generation, same model, same run.

  (a) transcription: real-time factor (seconds of work per second of audio) of one clip
      through AudioTranscription vs mlx-audio's `generate_transcription` on the same file
  (b) two transcriptions sent at once through ours (they take turns) vs the two one after the
      other through mlx-audio: wall time of the pair
  (c) speech: real-time factor of TTS (the WAV written) vs the model's `generate`, called as
      mlx-audio's `generate_audio` calls it, on the same text
  (d) voice activity: VAD on a clip's samples vs the model's `generate`

Like for like: the raw side runs in this process while the server idles, the server's side
while this process idles, both with the OpenBLAS the server preloads (this process re-execs
itself with it, as the server does); the sides alternate which goes first; both sides give the
same output (checked each round). The models are the audio matrix's (tests/zoo/audio/): Whisper
(large-v3 layout, width 32), Kokoro (its decoder widths fixed in code: 57M parameters) and
Silero VAD (its real weights). The server runs with its defaults.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TQDM_DISABLE", "1")  # Whisper's progress bars, on both sides
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, os.path.join(REPO, "tests")]

TEXT = ("Buenos días. El tren sale a las ocho y llega a la costa antes del mediodía, "
        "cuando el sol ya calienta la arena.")


def _load_raw(kind: str, path: str):
    from pathlib import Path

    if kind == "stt":
        from mlx_audio.stt.utils import load_model
    elif kind == "tts":
        import espeakng_loader
        from mlx_audio.tts.utils import load_model

        os.environ.setdefault("PHONEMIZER_ESPEAK_LIBRARY", espeakng_loader.get_library_path())
        os.environ.setdefault("PHONEMIZER_ESPEAK_DATA_PATH", espeakng_loader.get_data_path())
    else:
        from mlx_audio.vad.utils import load_model
    return load_model(Path(path))


def raw_transcribe(model, path: str) -> str:
    from mlx_audio.stt.generate import generate_transcription

    with tempfile.TemporaryDirectory() as scratch:
        return generate_transcription(model=model, audio=path, output_path=os.path.join(scratch, "t"),
                                      format="json").text


def raw_speak(model, kwargs: dict) -> int:
    call = dict(text=TEXT, speed=1.0, lang_code="en", ref_audio=None, ref_text=None, verbose=False, stream=False,
                streaming_interval=2.0, instruct=None, use_zero_spk_emb=False)
    call.update(kwargs)
    return sum(int(r.audio.size) for r in model.generate(**call))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def median_ratio(ours, raw) -> str:
    ratios = [o / r for o, r in zip(ours, raw)]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}..{max(ratios):.2f}]"


def main() -> None:
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()  # the raw side computes with the BLAS the server computes with
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the clip transcribed")
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-audio-server.log"))
    args = ap.parse_args()

    from audio_clips import clip, write_wav
    from common.launcher import Backend, backend_pb2
    from conftest import run_threads
    from zoo.audio import builder
    from zoo.audio.families import recipes

    whisper, kokoro, silero = (builder.build("stt", "whisper"), builder.build("tts", "kokoro"),
                               builder.build("vad", "silero_vad"))
    voice = recipes("tts")["kokoro"].generate
    folder = tempfile.mkdtemp(prefix="bench-audio-")
    clips = [write_wav(os.path.join(folder, f"clip-{s}.wav"), clip(s, args.seconds)) for s in (11, 12)]
    samples = clip(13, args.seconds)
    print(f"clips of {args.seconds:g} s, {args.rounds} rounds; server log {args.log}", flush=True)
    results = {k: ([], []) for k in ("a", "b", "c", "d")}
    with Backend(log_path=args.log) as b:
        stub = b.stub

        def load(path):
            r = stub.LoadModel(backend_pb2.ModelOptions(Model=path), timeout=600)
            assert r.success, r.message

        # (a), (b): transcription
        load(whisper)
        raw = _load_raw("stt", whisper)
        for i in range(args.rounds):
            def ours_one():
                return stub.AudioTranscription(backend_pb2.TranscriptRequest(dst=clips[0]), timeout=3600).text

            def ours_two():
                return [r.text for r in run_threads([lambda p=p: stub.AudioTranscription(
                    backend_pb2.TranscriptRequest(dst=p), timeout=3600) for p in clips])]

            def raw_two():
                return [raw_transcribe(raw, p) for p in clips]

            sides = [("ours", ours_one, ours_two), ("raw", lambda: raw_transcribe(raw, clips[0]), raw_two)]
            outs = {}
            for name, one, two in (sides if i % 2 == 0 else sides[::-1]):
                outs[name] = [timed(one), timed(two)]
            assert outs["ours"][0][0] == outs["raw"][0][0] and outs["ours"][1][0] == outs["raw"][1][0], outs
            results["a"][0].append(outs["ours"][0][1] / args.seconds)
            results["a"][1].append(outs["raw"][0][1] / args.seconds)
            results["b"][0].append(outs["ours"][1][1])
            results["b"][1].append(outs["raw"][1][1])
            print(f"round {i + 1}: (a) RTF ours {results['a'][0][-1]:.4f} raw {results['a'][1][-1]:.4f}; "
                  f"(b) pair ours {outs['ours'][1][1]:.2f} s raw {outs['raw'][1][1]:.2f} s", flush=True)
        del raw

        # (c): speech
        load(kokoro)
        raw = _load_raw("tts", kokoro)
        rate = 24000
        for i in range(args.rounds):
            dst = os.path.join(folder, "speech.wav")

            def ours():
                request = backend_pb2.TTSRequest(text=TEXT, dst=dst, voice=voice.get("voice", ""),
                                                 language=voice.get("lang_code", ""))
                assert stub.TTS(request, timeout=3600).success
                return (os.path.getsize(dst) - 44) // 2

            sides = [("ours", ours), ("raw", lambda: raw_speak(raw, voice))]
            outs = {name: timed(fn) for name, fn in (sides if i % 2 == 0 else sides[::-1])}
            assert outs["ours"][0] == outs["raw"][0], outs
            seconds = outs["raw"][0] / rate
            results["c"][0].append(outs["ours"][1] / seconds)
            results["c"][1].append(outs["raw"][1] / seconds)
            print(f"round {i + 1}: (c) {seconds:.1f} s of speech, RTF ours {results['c'][0][-1]:.3f} "
                  f"raw {results['c'][1][-1]:.3f}", flush=True)
        del raw

        # (d): voice activity
        load(silero)
        raw = _load_raw("vad", silero)
        for i in range(args.rounds):
            def ours():
                return [(s.start, s.end) for s in stub.VAD(backend_pb2.VADRequest(audio=samples.tolist()),
                                                           timeout=600).segments]

            def raw_vad():
                out = raw.generate(samples, sample_rate=16000)
                return [(t["start"] / out.sample_rate, t["end"] / out.sample_rate) for t in out.timestamps]

            sides = [("ours", ours), ("raw", raw_vad)]
            outs = {name: timed(fn) for name, fn in (sides if i % 2 == 0 else sides[::-1])}
            assert len(outs["ours"][0]) == len(outs["raw"][0]), outs
            results["d"][0].append(outs["ours"][1] / args.seconds)
            results["d"][1].append(outs["raw"][1] / args.seconds)
            print(f"round {i + 1}: (d) RTF ours {results['d'][0][-1]:.5f} raw {results['d'][1][-1]:.5f}", flush=True)

    print("\nratios ours / raw (median [min..max]; under 1 is faster):")
    labels = {"a": "(a) transcription RTF", "b": "(b) two transcriptions at once, wall",
              "c": "(c) speech RTF", "d": "(d) voice activity RTF"}
    for key, label in labels.items():
        ours, raw = results[key]
        print(f"  {label}: ours {statistics.median(ours):.4f} raw {statistics.median(raw):.4f}: "
              f"{median_ratio(ours, raw)}")


if __name__ == "__main__":
    main()
