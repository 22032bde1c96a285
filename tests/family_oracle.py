"""The library's own greedy generation, run in a process of its own: the oracle.

Reads a list of jobs {"model": dir, "prompts": [text...], "max_tokens": n,
"score": [[prompt, [candidate...]]...]} as JSON on stdin and writes, per job,
{"greedy": per prompt,
mlx-lm's `stream_generate` result: its text, and `exact`: the text up to the
first step whose top-2 log-probability margin is under MARGIN (past it, any
float reordering may pick the other token, so a comparison ends there);
"score": per candidate, its log-probability after the prompt from one plain
forward pass of the model over prompt + candidate}. Nothing of the backend is
imported; the process computes with the BLAS the server preloads (server_blas_env).
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

    ids = _ids(tokenizer, prompt)
    tokens, cut = [], None
    for r in stream_generate(model, tokenizer, ids, max_tokens=max_tokens):
        top2 = sorted(mx.topk(r.logprobs, 2).tolist())
        if cut is None and top2[1] - top2[0] < MARGIN:
            cut = len(tokens)  # this step's token is already uncertain
        tokens.append(r.token)
    exact = tokens if cut is None else tokens[:cut]
    return {"tokens": tokens, "text": tokenizer.decode(tokens), "exact": tokenizer.decode(exact),
            "cut": cut}


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


def answer(spec: dict) -> dict:
    from mlx_lm import load

    model, tokenizer = load(spec["model"])
    return {"greedy": [greedy(model, tokenizer, p, spec["max_tokens"]) for p in spec["prompts"]],
            "score": [[score(model, tokenizer, p, c) for c in cands] for p, cands in spec["score"]]}


def main() -> None:
    json.dump([answer(spec) for spec in json.load(sys.stdin)], sys.stdout)


if __name__ == "__main__":
    main()
