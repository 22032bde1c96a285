"""Deterministic audio for the tests: clips drawn from a seed, and WAV files of them.

A clip is a few voiced stretches (each a sum of seeded harmonics under a smooth envelope,
as a voice has a pitch and formants) separated by near-silent gaps, at 16 kHz by default:
two seeds give two different signals everywhere, so a model whose answer depends on its
input answers two clips differently, and a voice-activity model has stretches to find.
Pure numpy: the server, the oracle and the tests all read the same samples.
"""

import io
import wave

import numpy as np

SAMPLE_RATE = 16000


def clip(seed: int, seconds: float = 2.0, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Float32 mono samples in [-1, 1] for `seed`: voiced stretches and gaps."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sample_rate))
    t = np.arange(n, dtype=np.float64) / sample_rate
    out = rng.normal(0.0, 0.002, n)  # the floor of a quiet room
    start = rng.uniform(0.05, 0.25)
    while start < seconds - 0.2:
        length = min(rng.uniform(0.3, 0.9), seconds - start - 0.05)
        inside = (t >= start) & (t < start + length)
        local = t[inside] - start
        envelope = np.sin(np.pi * local / length) ** 2
        pitch = rng.uniform(90.0, 260.0) * (1.0 + 0.08 * np.sin(2 * np.pi * rng.uniform(1, 4) * local))
        phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
        voiced = sum(rng.uniform(0.2, 1.0) / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi)) for k in range(1, 9))
        out[inside] += 0.5 * envelope * voiced / 2.0
        start += length + rng.uniform(0.15, 0.5)
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def wav_bytes(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit PCM mono WAV of `samples` (float in [-1, 1])."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def write_wav(path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
    with open(path, "wb") as f:
        f.write(wav_bytes(samples, sample_rate))
    return str(path)


def read_wav(path):
    """(float32 samples in [-1, 1], sample rate) of a 16-bit PCM mono WAV."""
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, "16-bit mono expected"
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32767.0), rate
