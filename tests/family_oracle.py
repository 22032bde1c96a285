"""The library's own greedy generation, run in a process of its own: the oracle.

Reads a list of jobs {"model": dir, "prompts": [text...], "max_tokens": n,
"score": [[prompt, [candidate...]]...]} as JSON on stdin and writes, per job,
{"greedy": per prompt,
mlx-lm's `stream_generate` result: its text as it streams it (a leading space
kept), `exact`: the text up to the first step whose top-2 log-probability
margin is under MARGIN (past it, any float reordering may pick the other
token, so a comparison ends there), `trimmable`: whether the library's cache
of prompt + reply can be cut back;
"score": per candidate, its log-probability after the prompt from one plain
forward pass of the model over prompt + candidate, "cache_kinds": the classes
of the model's prompt cache, "divides": the ways mlx-lm can split it over ranks}. Nothing of the backend is imported; the process
computes with the BLAS the server preloads (server_blas_env).

With --lines it answers one JSON line per job as each is done, a job whose
library generation fails answering {"error": ...} (OracleStream reads them).
"""

import json
import os
import sys

MARGIN = 1e-3


def server_blas_env() -> dict:
    """This environment with the BLAS the server preloads (common/openblas.py): the library's
    output under the same float arithmetic (a reference BLAS and OpenBLAS can round a tiny
    model's close top-2 differently)."""
    from common.openblas import preload_env

    return preload_env() or dict(os.environ)


def greedy(model, tokenizer, prompt: str, max_tokens: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    ids = _ids(tokenizer, prompt)
    tokens, text, cut = [], "", None
    nan = False
    cache = make_prompt_cache(model)
    for r in stream_generate(model, tokenizer, ids, max_tokens=max_tokens, prompt_cache=cache):
        nan = nan or mx.isnan(r.logprobs).any().item()
        top2 = sorted(mx.topk(r.logprobs, 2).tolist())
        if cut is None and top2[1] - top2[0] < MARGIN:
            cut = len(tokens)  # this step's token is already uncertain
        tokens.append(r.token)
        text += r.text
    # The text as mlx-lm streams it (its detokenizer, not tokenizer.decode: they differ on a
    # byte-level token that is not valid UTF-8 alone, which tiny random models often pick),
    # with the leading space its detokenizer drops from a text put back: a continuation keeps it.
    certain = tokens if cut is None else tokens[:cut]
    exact = text if cut is None else _detokenize(tokenizer, certain)
    return {"tokens": tokens, "text": _spaced(tokenizer, tokens, text),
            "exact": _spaced(tokenizer, certain, exact), "cut": cut, "nan": nan,
            # whether the cache of prompt + reply can be cut back (a window that wrapped cannot)
            "trimmable": can_trim_prompt_cache(cache)}


def _spaced(tokenizer, tokens, text: str) -> str:
    """`text` with the leading spaces the decoded tokens have and it lacks."""
    decoded = tokenizer.decode(tokens)
    missing = (len(decoded) - len(decoded.lstrip(" "))) - (len(text) - len(text.lstrip(" ")))
    return " " * max(missing, 0) + text


def _detokenize(tokenizer, tokens) -> str:
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for t in tokens:
        detokenizer.add_token(t)
    detokenizer.finalize()
    return detokenizer.text


def _ids(tokenizer, text: str):
    bos = tokenizer.bos_token
    return tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))


def score(model, tokenizer, prompt: str, candidate: str) -> float:
    """log P(candidate | prompt): the tokens of prompt + candidate past the prompt's own."""
    import mlx.core as mx

    p, full = _ids(tokenizer, prompt), _ids(tokenizer, prompt + candidate)
    start = next((i for i, (a, b) in enumerate(zip(p, full)) if a != b), min(len(p), len(full)))
    logits = model(mx.array([full]))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return sum(logprobs[i - 1, full[i]].item() for i in range(start, len(full)))


class Oracle:
    """One oracle process answering several jobs (models), started now, read on demand: it
    computes while the caller does other work (starts the server, builds models)."""

    def __init__(self, jobs):
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=server_blas_env())
        self.jobs = list(jobs)
        self.answers = None

    def result(self, timeout: float = 600) -> list:
        if self.answers is None:
            out, err = self.proc.communicate(json.dumps(self.jobs), timeout=timeout)
            if self.proc.returncode:
                raise RuntimeError(f"the oracle failed: {err[-2000:]}")
            self.answers = json.loads(out)
        return self.answers


class OracleStream:
    """One oracle process for many jobs, each answer read as soon as it is computed (the caller
    serves job i while the oracle computes job i+1). A job whose generation fails answers
    {"error": ...}; a job that crashes the process answers {"error": ...} with the signal, and
    a new process takes the jobs after it. `script`: the oracle program (vision_oracle.py's
    too reads jobs on stdin and, with --lines, writes an answer a line)."""

    def __init__(self, jobs, script: str = __file__):
        self.jobs = list(jobs)
        self.script = script
        self.answers = []
        self._start()

    def _start(self):
        import queue
        import subprocess
        import tempfile
        import threading

        self.offset = len(self.answers)
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, self.script, "--lines"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=server_blas_env())
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines

        def feed():  # on a thread: a large job list would fill the pipe before the oracle reads it
            try:
                proc.stdin.write(json.dumps(self.jobs[self.offset:]))
                proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass

        def read():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=feed, daemon=True).start()
        threading.Thread(target=read, daemon=True).start()

    def answer(self, i: int, timeout: float = 600) -> dict:
        import signal

        while len(self.answers) <= i:
            line = self.lines.get(timeout=timeout)
            if line is not None:
                self.answers.append(json.loads(line))
                continue
            code = self.proc.wait()
            self.stderr.seek(0)
            tail = self.stderr.read()[-400:]
            how = signal.Signals(-code).name if code < 0 else f"exit {code}"
            self.answers.append({"error": f"the library crashed the process ({how}): {tail}"})
            if len(self.answers) < len(self.jobs):
                self._start()
        return self.answers[i]

    def close(self):
        self.proc.kill()
        self.proc.wait()


def job(model: str, prompts, max_tokens: int, scores=()) -> dict:
    return {"model": model, "prompts": list(prompts), "max_tokens": max_tokens, "score": list(scores)}


def run(model: str, prompts, max_tokens: int) -> list:
    """The greedy answers for one model, computed in a separate Python process."""
    return Oracle([job(model, prompts, max_tokens)]).result()[0]["greedy"]


def agrees(text: str, answer: dict) -> bool:
    """Whether a served text is the oracle's, up to its last certain step."""
    if answer["cut"] is None:
        return text == answer["text"]
    return text.startswith(answer["exact"].rstrip("\ufffd"))


def cache_kinds(model) -> list:
    """The class names of the model's prompt cache, each once, a CacheList's parts after it."""
    from mlx_lm.models.cache import CacheList, make_prompt_cache

    def names(c):
        inner = [n for part in c.caches for n in names(part)] if isinstance(c, CacheList) else []
        return [type(c).__name__, *inner]

    return list(dict.fromkeys(n for layer in make_prompt_cache(model) for n in names(layer)))


def answer(spec: dict) -> dict:
    from mlx_lm import load

    model, tokenizer = load(spec["model"])
    return {"greedy": [greedy(model, tokenizer, p, spec["max_tokens"]) for p in spec["prompts"]],
            "score": [[score(model, tokenizer, p, c) for c in cands] for p, cands in spec["score"]],
            "cache_kinds": cache_kinds(model), "divides": divides(model)}


def divides(model) -> list:
    """How mlx-lm can split the model over ranks, asked as its own `sharded_load` asks: "tensor"
    where the model has `shard()`, "pipeline" where its inner model has `pipeline()`."""
    return ((["tensor"] if hasattr(model, "shard") else [])
            + (["pipeline"] if hasattr(getattr(model, "model", None), "pipeline") else []))


def _answer_or_error(spec: dict) -> dict:
    import traceback

    try:
        out = answer(spec)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:600], "traceback": traceback.format_exc()[-3000:]}
    if any(g["nan"] for g in out["greedy"]):
        return {"error": "mlx-lm's generation gives NaN log-probabilities on the CPU"}
    return out


def main() -> None:
    jobs = json.load(sys.stdin)
    if "--lines" in sys.argv:
        for spec in jobs:
            print(json.dumps(_answer_or_error(spec)), flush=True)
    else:
        json.dump([answer(spec) for spec in jobs], sys.stdout)


if __name__ == "__main__":
    main()
