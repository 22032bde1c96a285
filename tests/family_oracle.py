"""The library's own greedy generation, run in a process of its own: the oracle.

Reads {"model": dir, "prompts": [text...], "max_tokens": n, "score": [[prompt,
[candidate...]]...]} as JSON on stdin and writes {"greedy": per prompt,
mlx-lm's `stream_generate` result: its text, and `exact`: the text up to the
first step whose top-2 log-probability margin is under MARGIN (past it, any
float reordering may pick the other token, so a comparison ends there);
"score": per candidate, its log-probability after the prompt from one plain
forward pass of the model over prompt + candidate}. Nothing of the backend is
imported.
"""

import json
import sys

MARGIN = 1e-3


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


def run_all(model: str, prompts, max_tokens: int, scores=()) -> dict:
    """The oracle's answers, computed in a separate Python process."""
    import subprocess

    job = json.dumps({"model": model, "prompts": list(prompts), "max_tokens": max_tokens, "score": list(scores)})
    out = subprocess.run([sys.executable, __file__], input=job, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"the oracle failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run(model: str, prompts, max_tokens: int) -> list:
    return run_all(model, prompts, max_tokens)["greedy"]


def agrees(text: str, answer: dict) -> bool:
    """Whether a served text is the oracle's, up to its last certain step."""
    if answer["cut"] is None:
        return text == answer["text"]
    return text.startswith(answer["exact"].rstrip("\ufffd"))


def main() -> None:
    from mlx_lm import load

    job = json.load(sys.stdin)
    model, tokenizer = load(job["model"])
    json.dump({"greedy": [greedy(model, tokenizer, p, job["max_tokens"]) for p in job["prompts"]],
               "score": [[score(model, tokenizer, p, c) for c in cands] for p, cands in job.get("score", [])]},
              sys.stdout)


if __name__ == "__main__":
    main()
