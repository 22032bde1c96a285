"""mlx-vlm's own greedy generation with an image, run in a process of its own: the oracle.

Reads a list of jobs {"model": dir, "question": text, "images": [[seed, width, height]...],
"max_tokens": n, "video": seed or null} as JSON on stdin (pictures and clips as vision_fixture
draws them); writes per job, a JSON line each as it is done, {"images": per picture the token
ids of mlx-vlm's `stream_generate` (temperature 0, at most max_tokens) up to the first step
whose top-2 margin is under MARGIN (past it, any float reordering may pick the other token, so
a comparison ends there), "video": the same for a clip of that seed (when asked and the
family's prompt holds it), "cache_kinds": the classes of the language model's prompt cache,
"error": why the library itself failed, else null, "video_error": the same for the clip, "audio":
per audio clip asked (seed, seconds of audio_clips.clip) the same tokens with the clip instead
of a picture, "audio_error"}.
Nothing of the backend is imported.
"""

import base64
import contextlib
import io
import json
import os
import sys
import tempfile

MARGIN = 1e-3


def _greedy(model, processor, prompt: str, max_tokens: int, **media) -> list:
    import mlx.core as mx
    from mlx_vlm import stream_generate

    tokens = []
    for r in stream_generate(model, processor, prompt, max_tokens=max_tokens, temperature=0.0, **media):
        top2 = sorted(mx.topk(r.logprobs.reshape(-1), 2).tolist())
        if top2[1] - top2[0] < MARGIN:
            break
        tokens.append(r.token)
    return tokens[:max_tokens]  # it may yield one past max_tokens


def _video_token(config):
    """The video token's id in the model's config, else in the first of its parts that has one
    (Qwen3-Omni's config wraps a thinker_config, which holds the token ids)."""
    import dataclasses

    for part in [config] + [v for v in vars(config).values() if dataclasses.is_dataclass(v)]:
        found = getattr(part, "video_token_id", None) or getattr(part, "video_token_index", None)
        if found is not None:
            return found
    return None


def _video(model, processor, question: str, seed: int, max_tokens: int):
    """The greedy tokens for a clip; None when the library's prompt holds no video tokens for
    this family (it would answer the question without looking: nothing to compare)."""
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs
    from vision_fixture import video_b64

    # The config's video token, else the processor's (MiniCPM-V 4.6's config names none).
    video_id = _video_token(model.config) or getattr(processor, "video_token_id", None)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "clip.mp4")
        with open(path, "wb") as f:
            f.write(base64.b64decode(video_b64(seed)))
        prompt = apply_chat_template(processor, model.config, question, video=path)
        try:
            ids = prepare_inputs(processor, videos=[path], prompts=prompt)["input_ids"]
        except Exception:  # the family's processor takes no video
            return None
        if video_id is None or video_id not in ids.reshape(-1).tolist():
            return None
        return _greedy(model, processor, prompt, max_tokens, video=[path])


def _audio(model, processor, question: str, clips, max_tokens: int) -> list:
    """Per clip (seed, seconds of audio_clips.clip, as a 16 kHz WAV), the greedy tokens of mlx-vlm's
    generation with the clip: its prompt from the library's chat templating with one audio."""
    from mlx_vlm.prompt_utils import apply_chat_template

    from audio_clips import clip, write_wav

    prompt = apply_chat_template(processor, model.config, question, num_audios=1)
    answers = []
    with tempfile.TemporaryDirectory() as folder:
        for seed, seconds in clips:
            path = write_wav(os.path.join(folder, f"clip-{seed}.wav"), clip(seed, seconds))
            answers.append(_greedy(model, processor, prompt, max_tokens, audio=[path]))
    return answers


def answer(job: dict) -> dict:
    from PIL import Image
    from mlx_vlm import load
    from mlx_vlm.models import cache as vlm_cache
    from mlx_vlm.prompt_utils import apply_chat_template
    from vision_fixture import image_b64

    out = {"images": [], "video": None, "cache_kinds": [], "error": None, "video_error": None, "audio": None,
           "audio_error": None}
    try:
        model, processor = load(job["model"])
        out["cache_kinds"] = sorted({type(c).__name__ for c in vlm_cache.make_prompt_cache(model.language_model)})
        prompt = apply_chat_template(processor, model.config, job["question"], num_images=1)
        for seed, width, height in job["images"]:
            image = Image.open(io.BytesIO(base64.b64decode(image_b64(seed, (width, height))))).convert("RGB")
            out["images"].append(_greedy(model, processor, prompt, job["max_tokens"], image=[image]))
    except Exception as e:  # the library itself cannot run this family here: said, not raised
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    if job.get("audio"):
        try:
            out["audio"] = _audio(model, processor, job["question"], job["audio"], job["max_tokens"])
        except Exception as e:  # the library cannot take a clip for this family here
            out["audio_error"] = f"{type(e).__name__}: {e}"
    if job.get("video") is not None:
        try:
            out["video"] = _video(model, processor, job["question"], job["video"], job["max_tokens"])
        except Exception as e:  # the library cannot take a clip for this family here
            out["video_error"] = f"{type(e).__name__}: {e}"
    return out


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for spec in json.load(sys.stdin):  # an answer a line, read as each is done (family_oracle.OracleStream)
        # Some processors print as they load (DeepSeek-VL2's); stdout carries only the answers.
        with contextlib.redirect_stdout(sys.stderr):
            out = answer(spec)
        print(json.dumps(out), flush=True)


def job(model: str, question: str, images, max_tokens: int, video=None, audio=()) -> dict:
    """`images`: (seed, width, height) of each picture asked about alone; `audio`: (seed, seconds)
    of each clip asked about alone."""
    return {"model": model, "question": question, "images": [list(i) for i in images], "max_tokens": max_tokens,
            "video": video, "audio": [list(a) for a in audio]}


def start(jobs):
    """The answers to `jobs`, computed in a process of its own that starts now, each read (by
    its index) as soon as it is done: the caller serves one family while the next computes."""
    from family_oracle import OracleStream

    return OracleStream(jobs, script=os.path.abspath(__file__))


if __name__ == "__main__":
    main()
