"""The library's own calls for each audio task, made as mlx-audio's own entry points make them.

Transcription: the model's `generate(audio, verbose=False, generation_stream=<stream>, ...)`
with only the keywords its signature names, as `mlx_audio.stt.generate.generate_transcription`
calls it. Speech: the model's `generate(text=..., ...)` with the arguments
`mlx_audio.tts.generate.generate_audio` hands it, each chunk it yields sent on as it comes.
Voice activity: the model's `generate(samples, sample_rate=...)` (its timestamps in samples),
or `detect(samples)` for a family that has only that (its spans in milliseconds). Engine
thread, inside a job's turn (turns.py).
"""

import inspect
from typing import Any, Callable, Dict, List

import numpy as np

# What mlx-audio's generate_audio passes every model's generate besides the text and the
# request's own choices (voice, lang_code, speed, sampling...).
SPEECH_DEFAULTS = dict(speed=1.0, lang_code="en", ref_audio=None, ref_text=None, verbose=False, stream=False,
                       streaming_interval=2.0, instruct=None, use_zero_spk_emb=False)


def accepted(fn, names) -> List[str]:
    """Which of `names` the callable `fn` takes as keywords (all, when it takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return list(names)
    return [n for n in names if n in params]


def transcribe(model, args: Dict[str, Any], stream) -> Dict[str, Any]:
    """{"text", "segments": [{"start", "end", "text", "tokens", "words"}], "language"} of one file."""
    params = inspect.signature(model.generate).parameters
    options = {k: v for k, v in args["options"].items() if k in params}  # as generate_transcription filters
    out = model.generate(args["path"], verbose=False, generation_stream=stream, **options)
    segments = []
    if getattr(out, "segments", None) is not None:
        for s in out.segments:
            segments.append({"start": s.get("start"), "end": s.get("end"), "text": s.get("text", ""),
                             "tokens": [int(t) for t in s.get("tokens", []) or []],
                             "words": [{"start": w.get("start"), "end": w.get("end"), "text": w.get("word", "")}
                                       for w in s.get("words", []) or []]})
    elif getattr(out, "sentences", None) is not None:  # aligned results (Parakeet, Canary): sentences of tokens
        for s in out.sentences:
            segments.append({"start": s.start, "end": s.end, "text": s.text, "tokens": [],
                             "words": [{"start": t.start, "end": t.end, "text": t.text}
                                       for t in getattr(s, "tokens", []) or []]})
    return {"text": str(out.text), "segments": segments, "language": getattr(out, "language", None)}


def speak(model, args: Dict[str, Any], emit: Callable[[Any], None]) -> Dict[str, Any]:
    """Each chunk (float32 samples, sample rate) the model yields for the text, emitted as it
    comes; the totals at the end."""
    import mlx.core as mx

    call = dict(SPEECH_DEFAULTS, text=args["text"], **args["options"])
    samples, rate = 0, None
    for result in model.generate(**call):
        audio = np.array(result.audio.astype(mx.float32), copy=True).reshape(-1)
        rate = int(result.sample_rate)
        samples += audio.size
        emit((audio, rate))
    return {"samples": samples, "sample_rate": rate}


def detect(model, args: Dict[str, Any]) -> List[List[float]]:
    """[start, end] seconds of each stretch of speech in the samples."""
    samples, rate = np.asarray(args["samples"], dtype=np.float32), args["sample_rate"]
    if hasattr(model, "generate"):
        out = model.generate(samples, sample_rate=rate)
        return [[s["start"] / out.sample_rate, s["end"] / out.sample_rate] for s in out.timestamps]
    return [[start / 1000.0, end / 1000.0] for start, end in model.detect(samples, sample_rate=rate)]
