"""Audio requests made jobs: a transcription, a text to speak, samples to search for speech.

Every field is read and checked here, on a preparation thread, before anything reaches the
engine: the file to transcribe exists, is audio the library decodes, and is within the bytes
and seconds the model's options allow (RESOURCE_EXHAUSTED past them); a text to speak is
not empty and within its characters; samples are finite and within their seconds; a request
option the model's own generate does not take is refused with the reason, never dropped.
What each option becomes is the keyword of the family's own `generate` (read from its
signature): a transcription's language, translation (`task`), prompt and temperature; a
voice, language (`lang_code`), speed, instructions (`instruct`) and sampling for speech.
"""

import functools
import inspect
import math
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional, Tuple

from common.python_utils import OptionError
from engine import EngineError
from engine.audio import AudioJob

# The keyword a family's generate names its prompt by, in the order tried (a forced aligner's
# prompt is the text it aligns).
PROMPT_KEYWORDS = ("initial_prompt", "prompt", "context", "system_prompt", "text")
# What TTSRequest.params may not set: the request's own fields, and what the server decides.
SPEECH_FIELDS = {"text": "text", "voice": "voice", "lang_code": "language", "instruct": "instructions",
                 "ref_audio": "", "ref_text": "", "stream": "", "streaming_interval": "", "verbose": "",
                 "use_zero_spk_emb": ""}
# What mlx-audio's generate_audio itself may pass any model's generate: a family whose generate
# takes **kwargs is given these by name; any other key would vanish into its **kwargs unread.
GENERATE_AUDIO_KEYS = {"speed", "temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "cfg_scale",
                       "ddpm_steps", "sigma", "prompt"}
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
FFPROBE_S = 30.0  # a probe of a container ffmpeg reads takes well under a second


def _accepts(fn) -> Tuple[set, bool]:
    params = inspect.signature(fn).parameters
    return set(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


_KWARGS_READ = re.compile(r"""kwargs(?:\.get|\.pop|\.setdefault)?[(\[]\s*["']([A-Za-z_]\w*)["']""")


@functools.lru_cache(maxsize=64)
def _read_from_kwargs(model_type: type) -> frozenset:
    """The keywords a family's module reads out of **kwargs by name (`kwargs.get("x")`,
    `kwargs["x"]`): a generate that takes **kwargs reads these and ignores any other."""
    try:
        source = inspect.getsource(sys.modules[model_type.__module__])
    except (OSError, TypeError, KeyError):
        return frozenset()
    return frozenset(_KWARGS_READ.findall(source))


# ---- speech to text ------------------------------------------------------------------------


def probe(path: str, field: str = "dst") -> Tuple[float, str]:
    """(seconds, how it was read) of an audio file. Its first 50 ms are decoded by mlx-audio's own
    reader, which picks the decoder as the model's generation will (miniaudio for WAV, MP3,
    FLAC; ffmpeg for M4A, Ogg, Opus, WebM...): a file it cannot decode is refused here with the
    library's words, not halfway through a job. The length comes from the header (miniaudio),
    or from ffprobe for what ffmpeg decodes. OptionError when it is not audio that can be read."""
    import miniaudio
    from mlx_audio.audio_io import read

    name = os.path.basename(path) if field == "dst" else "it"
    try:
        read(path, dtype="float32", duration=0.05)
    except Exception as e:  # miniaudio's DecodeError, ffmpeg's absence or refusal: the library's words
        why = " ".join(str(e).split()) or type(e).__name__
        if "ffmpeg" in why.lower() and shutil.which("ffmpeg") is None:
            raise OptionError(f"{field}: {name} is in a container mlx-audio decodes with ffmpeg (M4A, Ogg, Opus, "
                              "WebM...), and ffmpeg is not installed here; WAV, MP3 and FLAC need nothing") from None
        raise OptionError(f"{field}: {name} is not audio mlx-audio can decode ({type(e).__name__}: {why[:300]})") from None
    # By its bytes, not its name (a request's clip is a file without an extension).
    for header in (miniaudio.wav_get_file_info, miniaudio.flac_get_file_info, miniaudio.mp3_get_file_info,
                   miniaudio.vorbis_get_file_info):
        try:
            info = header(path)
            return info.duration, info.file_format.name.lower()
        except Exception:  # not this format
            continue
    ffprobe = shutil.which("ffprobe")  # not one of miniaudio's formats: ffmpeg read it above
    if ffprobe is None:
        raise OptionError(f"{field}: the length of {name} cannot be read without ffprobe (ffmpeg)")
    done = subprocess.run([ffprobe, "-v", "error", "-show_entries", "format=duration",
                           "-of", "csv=p=0", path], capture_output=True, text=True, timeout=FFPROBE_S)
    try:
        return float(done.stdout.strip()), "ffmpeg"
    except ValueError:
        raise OptionError(f"{field}: the length of {name} cannot be read ({done.stderr.strip()[:200]})") from None


def transcription_job(lm, req) -> AudioJob:
    """The job for a TranscriptRequest (AudioTranscription, AudioTranscriptionStream)."""
    options = lm.options
    path = req.dst
    if not path:
        raise OptionError("dst: empty (the path of the audio file to transcribe)")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise EngineError("NOT_FOUND", f"dst: no file at {path}") from None
    except OSError as e:
        raise OptionError(f"dst: {path} cannot be read ({e.strerror or e})") from None
    if not os.path.isfile(path):
        raise OptionError(f"dst: {path} is not a file")
    if st.st_size > options.audio_max_bytes:
        raise EngineError("RESOURCE_EXHAUSTED", f"dst: {st.st_size} bytes; at most {options.audio_max_bytes} "
                          "(option audio_max_bytes)")
    seconds, read_as = probe(path)
    if not seconds > 0:
        raise OptionError(f"dst: {os.path.basename(path)} holds no audio (0 seconds)")
    if seconds > options.audio_max_seconds:
        raise EngineError("RESOURCE_EXHAUSTED", f"dst: {seconds:.1f} seconds of audio; at most "
                          f"{options.audio_max_seconds:g} (option audio_max_seconds)")
    if req.diarize:
        raise OptionError("diarize: speaker diarization is not served by this backend")
    names, anything = _accepts(lm.model.generate)
    family = lm.audio.family
    generate: Dict[str, Any] = {}
    language = req.language or options.language
    if language:
        if "language" not in names and not anything:
            raise OptionError(f"language: {family}'s generate takes no language")
        generate["language"] = language
    if req.translate:
        if "task" not in names:
            raise OptionError(f"translate: {family} does not translate (its generate has no task)")
        generate["task"] = "translate"
    if req.prompt:
        keyword = next((k for k in PROMPT_KEYWORDS if k in names), None)
        if keyword is None:
            raise OptionError(f"prompt: {family}'s generate takes no prompt ({', '.join(PROMPT_KEYWORDS)})")
        generate[keyword] = req.prompt
    if req.temperature:
        if not (0 < req.temperature <= 2) or not math.isfinite(req.temperature):
            raise OptionError(f"temperature: expected a number in (0, 2], got {req.temperature}")
        if "temperature" not in names:
            raise OptionError(f"temperature: {family}'s generate takes no temperature")
        generate["temperature"] = float(req.temperature)
    if options.max_tokens and ("max_tokens" in names or anything):  # the load option bounds the text too
        generate["max_tokens"] = options.max_tokens
    granularities = {g.lower() for g in req.timestamp_granularities}
    unknown = granularities - {"segment", "word"}
    if unknown:
        raise OptionError(f"timestamp_granularities: {sorted(unknown)} (expected segment, word)")
    if "word" in granularities and "word_timestamps" in names:
        generate["word_timestamps"] = True
    return AudioJob(task="transcribe", args={"path": path, "options": generate, "seconds": seconds,
                                             "read_as": read_as}, model_epoch=lm.epoch,
                    label=f"{os.path.basename(path)}, {seconds:.1f} s")


# ---- text to speech ------------------------------------------------------------------------


def voices(lm) -> Optional[list]:
    """The voices a model's folder holds (a `voices/` folder of voice packs), or None when the
    model does not list them (then the library decides)."""
    folder = os.path.join(lm.source, "voices")
    if not os.path.isdir(folder):
        return None
    return sorted(os.path.splitext(n)[0] for n in os.listdir(folder) if not n.startswith("."))


def speech_job(lm, req, need_dst: bool) -> AudioJob:
    """The job for a TTSRequest (TTS writes `dst`; TTSStream sends the samples)."""
    options = lm.options
    text = req.text
    if not text.strip():
        raise OptionError("text: empty (nothing to speak)")
    if len(text) > options.tts_max_chars:
        raise EngineError("RESOURCE_EXHAUSTED", f"text: {len(text)} characters; at most {options.tts_max_chars} "
                          "(option tts_max_chars)")
    if need_dst:
        if not req.dst:
            raise OptionError("dst: empty (the path of the WAV file to write)")
        parent = os.path.dirname(os.path.abspath(req.dst)) or "."
        if not os.path.isdir(parent):
            raise OptionError(f"dst: the folder {parent} does not exist")
        if os.path.isdir(req.dst):
            raise OptionError(f"dst: {req.dst} is a folder")
    names, anything = _accepts(lm.model.generate)
    family = lm.audio.family
    generate: Dict[str, Any] = {"speed": options.speed}
    voice = req.voice or options.voice
    if voice:
        known = voices(lm)
        if known is not None and voice not in known:
            raise OptionError(f"voice: {voice!r} is not one of this model's voices ({', '.join(known) or 'none'})")
        generate["voice"] = voice
    language = req.language if req.HasField("language") and req.language else options.language
    if language:
        generate["lang_code"] = language
    if req.HasField("instructions") and req.instructions:
        generate["instruct"] = req.instructions
    if options.max_tokens and ("max_tokens" in names or anything):  # the load option bounds the codes made
        generate["max_tokens"] = options.max_tokens
    params = inspect.signature(lm.model.generate).parameters
    for key, value in req.params.items():
        if key in SPEECH_FIELDS:
            field = SPEECH_FIELDS[key]
            raise OptionError(f"params: {key} is set by the request's {field} field" if field else
                              f"params: {key} is not a request option here")
        if key not in names and not (anything and (key in GENERATE_AUDIO_KEYS
                                                   or key in _read_from_kwargs(type(lm.model)))):
            raise OptionError(f"params: {family}'s generate takes no {key} "
                              f"(it takes: {', '.join(sorted(n for n in names if n not in SPEECH_FIELDS))})")
        generate[key] = _typed(key, value, params.get(key))
    if not 0.1 <= float(generate["speed"]) <= 10:
        raise OptionError(f"params: speed={generate['speed']} is out of range [0.1, 10]")
    return AudioJob(task="speak", args={"text": text, "options": generate, "dst": req.dst}, model_epoch=lm.epoch,
                    label=f"{len(text)} characters")


def _typed(key: str, value: str, param) -> Any:
    """A params string as the type of its keyword's default in the family's generate (a bool, an
    int, a float or a string); for a keyword without one, the first of int, float, bool, text
    that reads it. A number must be finite."""
    default = param.default if param is not None and param.default is not inspect.Parameter.empty else None
    text = value.strip()
    try:
        if isinstance(default, bool):
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            number = float(text)
        elif isinstance(default, str):
            return value
        else:
            for read in (int, float):
                try:
                    number = read(text)
                    break
                except ValueError:
                    continue
            else:
                return text.lower() in _TRUE if text.lower() in _TRUE | _FALSE else value
    except ValueError:
        want = type(default).__name__ if default is not None else "a value"
        raise OptionError(f"params: {key} expected {want}, got {value!r}") from None
    if not math.isfinite(number):
        raise OptionError(f"params: {key} must be a finite number, got {value!r}")
    return number


# ---- voice activity ------------------------------------------------------------------------


def voice_job(lm, req) -> AudioJob:
    """The job for a VADRequest: float samples at the model's option vad_sample_rate."""
    import numpy as np

    options = lm.options
    rate = options.vad_sample_rate
    count = len(req.audio)
    if count == 0:
        raise OptionError("audio: no samples")
    if count > options.vad_max_seconds * rate:
        raise EngineError("RESOURCE_EXHAUSTED", f"audio: {count} samples ({count / rate:.1f} s at {rate} Hz); at most "
                          f"{options.vad_max_seconds:g} s (option vad_max_seconds)")
    samples = np.asarray(req.audio, dtype=np.float32)
    if not np.isfinite(samples).all():
        raise OptionError("audio: samples must be finite numbers (NaN or infinity found)")
    return AudioJob(task="detect", args={"samples": samples, "sample_rate": rate}, model_epoch=lm.epoch,
                    label=f"{count} samples")
