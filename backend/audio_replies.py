"""Audio jobs' results -> what the host reads: transcripts, WAV files, PCM chunks, voice segments.

A transcript's segment and word times are int64 nanoseconds (LocalAI reads them as Go's
time.Duration, core/backend/transcript.go); its duration is seconds. Speech is 16-bit PCM,
mono, at the model's own sample rate: a WAV file for TTS (written beside `dst` and put in
place whole), and for TTSStream first a message {"sample_rate": N} (LocalAI writes its WAV
header from it), then the samples as they are made. Preparation thread or event loop: no
model work here.
"""

import io
import json
import os
import wave
from typing import Iterable, Tuple

import numpy as np

import backend_pb2
import store

NS = 1_000_000_000


def _ns(seconds) -> int:
    return int(round(float(seconds) * NS)) if seconds is not None else 0


def transcript_result(out: dict, seconds: float) -> "backend_pb2.TranscriptResult":
    segments = []
    for i, s in enumerate(out["segments"]):
        words = [backend_pb2.TranscriptWord(start=_ns(w["start"]), end=_ns(w["end"]), text=str(w["text"]))
                 for w in s.get("words", [])]
        segments.append(backend_pb2.TranscriptSegment(
            id=i, start=_ns(s["start"]), end=_ns(s["end"]), text=str(s["text"]),
            tokens=[t for t in s.get("tokens", []) if -2**31 <= t < 2**31], words=words))
    language = out.get("language")
    if isinstance(language, (list, tuple)):  # a family that answers per input: this one input's
        language = language[0] if language else None
    return backend_pb2.TranscriptResult(segments=segments, text=out["text"], language=str(language or ""),
                                        duration=float(seconds))


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian 16-bit PCM (clipped, rounded)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def write_wav(dst: str, chunks: Iterable[Tuple[np.ndarray, int]], rate: int) -> int:
    """The chunks as one 16-bit mono WAV at `rate`, written whole to `dst`; its bytes."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        for samples, _ in chunks:
            w.writeframes(pcm16(samples))
    data = buf.getvalue()
    tmp = f"{dst}.partial-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        store.publish(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(data)


def stream_header(rate: int) -> "backend_pb2.Reply":
    return backend_pb2.Reply(message=json.dumps({"sample_rate": int(rate)}).encode())


def stream_chunk(samples: np.ndarray) -> "backend_pb2.Reply":
    return backend_pb2.Reply(audio=pcm16(samples))


def vad_response(segments) -> "backend_pb2.VADResponse":
    return backend_pb2.VADResponse(segments=[backend_pb2.VADSegment(start=float(a), end=float(b))
                                             for a, b in segments])
