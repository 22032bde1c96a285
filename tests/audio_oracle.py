"""mlx-audio's own generation, run in a process of its own: the audio matrix's oracle.

Reads a list of jobs {"kind": "stt" | "tts" | "vad", "model": folder, "inputs": [...],
"generate": {keyword arguments}} as JSON on stdin; writes per job, a JSON line each as it is
done, {"outputs": [one per input], "error": why the library itself failed, else null}:
- stt: an input is the path of an audio file; the output is what mlx-audio's
  `generate_transcription` returns for it: {"text", "segments": [{"start", "end", "text"}],
  "language"}.
- tts: an input is a text; the output is {"sample_rate", "audio": base64 of the float32
  samples} of every chunk the model's `generate` yields, joined, called with the arguments
  mlx-audio's `generate_audio` passes it.
- vad: an input is [seed, seconds, sample_rate] of audio_clips.clip; the output is
  {"segments": [[start, end] in seconds]} of the model's `generate` (its timestamps in
  samples), or of its `detect` for a family that has no generate (spans in milliseconds).
Nothing of the backend is imported.
"""

import base64
import contextlib
import json
import os
import sys
import tempfile


def _load(kind: str, folder: str):
    from pathlib import Path

    if kind == "stt":
        from mlx_audio.stt.utils import load_model
    elif kind == "tts":
        import espeakng_loader
        from mlx_audio.tts.utils import load_model

        # phonemizer (KittenTTS) finds the espeak-ng espeakng-loader bundles only when told where
        os.environ.setdefault("PHONEMIZER_ESPEAK_LIBRARY", espeakng_loader.get_library_path())
        os.environ.setdefault("PHONEMIZER_ESPEAK_DATA_PATH", espeakng_loader.get_data_path())
    else:
        from mlx_audio.vad.utils import load_model
    return load_model(Path(folder))


def _stt(model, path: str, kwargs: dict) -> dict:
    from mlx_audio.stt.generate import generate_transcription

    with tempfile.TemporaryDirectory() as scratch:
        out = generate_transcription(model=model, audio=path, output_path=os.path.join(scratch, "t"),
                                     format="json", **kwargs)
    if getattr(out, "segments", None) is not None:
        segments = [{"start": s.get("start"), "end": s.get("end"), "text": s.get("text", "")} for s in out.segments]
    else:  # an aligned result (Parakeet and its kin): sentences, each with its times
        segments = [{"start": s.start, "end": s.end, "text": s.text} for s in getattr(out, "sentences", None) or []]
    language = getattr(out, "language", None)
    return {"text": out.text, "segments": segments, "language": language if isinstance(language, str) else None}


def _tts(model, text: str, kwargs: dict) -> dict:
    import mlx.core as mx
    import numpy as np

    # What mlx_audio.tts.generate.generate_audio hands the model's generate (it prints and
    # swallows errors, so its call is made here as it makes it).
    call = dict(text=text, speed=1.0, lang_code="en", ref_audio=None, ref_text=None, verbose=False, stream=False,
                streaming_interval=2.0, instruct=None, use_zero_spk_emb=False)
    call.update(kwargs)
    chunks, rate = [], getattr(model, "sample_rate", None)
    for result in model.generate(**call):
        chunks.append(np.array(result.audio.astype(mx.float32)).reshape(-1))
        rate = result.sample_rate
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return {"sample_rate": rate, "audio": base64.b64encode(audio.astype("<f4").tobytes()).decode()}


def _vad(model, spec, kwargs: dict) -> dict:
    from audio_clips import clip

    seed, seconds, rate = spec
    samples = clip(seed, seconds, rate)
    if not hasattr(model, "generate"):  # FSMN has only detect: [[start_ms, end_ms]] of 16 kHz samples
        return {"segments": [[a / 1000.0, b / 1000.0] for a, b in model.detect(samples, sample_rate=rate)]}
    out = model.generate(samples, sample_rate=rate, **kwargs)
    segments = []
    for stamp in out.timestamps:  # samples, as the library returns them by default
        segments.append([stamp["start"] / out.sample_rate, stamp["end"] / out.sample_rate])
    return {"segments": segments}


def answer(job: dict) -> dict:
    run = {"stt": _stt, "tts": _tts, "vad": _vad}[job["kind"]]
    try:
        model = _load(job["kind"], job["model"])
        return {"outputs": [run(model, item, dict(job.get("generate") or {})) for item in job["inputs"]],
                "error": None}
    except Exception as e:  # the library itself cannot run this family here: said, not raised
        return {"outputs": [], "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for spec in json.load(sys.stdin):  # an answer a line, read as each is done (family_oracle.OracleStream)
        with contextlib.redirect_stdout(sys.stderr):  # the library prints as it works
            out = answer(spec)
        print(json.dumps(out), flush=True)


def start(jobs):
    """The answers to `jobs`, computed in a process of its own that starts now, each read (by its
    index) as soon as it is done."""
    from family_oracle import OracleStream

    return OracleStream(jobs, script=os.path.abspath(__file__))


if __name__ == "__main__":
    main()
