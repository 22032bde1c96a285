"""mlx-lm's own greedy answers at a low precision, and where a comparison with them must end.

Reads jobs {"model": folder, "prompts": [text...], "max_tokens": n} as JSON on stdin; with
--lines writes per job, a JSON line each as it is done, {"greedy": per prompt {"tokens",
"text", "exact", "cut", "margins", "spacings"}, "noise": {"max": ..., "units": ...}, "error"}.

The single stream is `stream_generate`'s. At bf16, q8, q4 and mxfp4 the logits and
log-probabilities come out in bfloat16, whose spacing (an ulp) at a value x is
2^(floor(log2|x|) - 7): two log-probabilities closer than that are the same number, and a
computation that orders its sums otherwise may land either side. The library's own noise is
measured here, not assumed: the same prompts through mlx-lm's BatchGenerator, each chosen
token's log-probability against the single stream's where their tokens agree, in spacings of
that step (`units`: at least 1, the resolution itself). A comparison ends at the first step
whose top-2 margin is under K x units spacings of the larger of the two (each may move by the
noise, the other way). Nothing of the backend is imported; the BLAS is the server's.
"""

import json
import math
import os
import sys

K = 2  # the top two may each move by the noise, in opposite directions


def spacing(value: float) -> float:
    """bfloat16's ulp at `value` (its 8 bits of significand)."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 2.0 ** -133


def single(model, tokenizer, ids, max_tokens: int):
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    tokens, chosen, margins, spacings, text = [], [], [], [], ""
    for r in stream_generate(model, tokenizer, ids, max_tokens=max_tokens):
        lp = r.logprobs.astype(mx.float32)
        top = sorted(mx.topk(lp, 2).tolist())
        tokens.append(r.token)
        chosen.append(lp[r.token].item())
        margins.append(top[1] - top[0])
        spacings.append(spacing(max(abs(top[0]), abs(top[1]))))
        text += r.text
    return tokens[:max_tokens], chosen[:max_tokens], margins[:max_tokens], spacings[:max_tokens], text


def batched(model, tokenizer, prompts, max_tokens: int):
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    uids = gen.insert(prompts, [max_tokens] * len(prompts))
    got = {u: ([], []) for u in uids}
    while responses := gen.next_generated():
        for r in responses:
            if r.finish_reason != "stop":
                got[r.uid][0].append(r.token)
                got[r.uid][1].append(r.logprobs.astype(mx.float32)[r.token].item())
    gen.close()
    return [got[u] for u in uids]


def answer(spec: dict) -> dict:
    from mlx_lm import load

    from family_oracle import _detokenize, _ids, _spaced

    model, tokenizer = load(spec["model"])
    n = spec["max_tokens"]
    prompts = [_ids(tokenizer, p) for p in spec["prompts"]]
    runs = [single(model, tokenizer, ids, n) for ids in prompts]
    noise, units = 0.0, 1
    for (tokens, chosen, _, spacings, _), (b_tokens, b_chosen) in zip(runs, batched(model, tokenizer, prompts, n)):
        for i, (t, bt) in enumerate(zip(tokens, b_tokens)):
            if t != bt:
                break
            moved = abs(chosen[i] - b_chosen[i])
            noise = max(noise, moved)
            units = max(units, math.ceil(moved / spacings[i]))
    greedy = []
    for tokens, _, margins, spacings, text in runs:
        cut = next((i for i, (m, s) in enumerate(zip(margins, spacings)) if m < K * units * s), None)
        certain = tokens if cut is None else tokens[:cut]
        exact = text if cut is None else _detokenize(tokenizer, certain)
        greedy.append({"tokens": tokens, "text": _spaced(tokenizer, tokens, text),
                       "exact": _spaced(tokenizer, certain, exact), "cut": cut, "margins": margins,
                       "spacings": spacings})
    return {"greedy": greedy, "noise": {"max": noise, "units": units}, "error": None}


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for spec in json.load(sys.stdin):
        try:
            out = answer(spec)
        except Exception as e:  # the library itself cannot run this variant here: said, not raised
            out = {"greedy": [], "noise": None, "error": f"{type(e).__name__}: {e}"[:600]}
        print(json.dumps(out), flush=True)


def start(jobs):
    from family_oracle import OracleStream

    return OracleStream(jobs, script=os.path.abspath(__file__))


if __name__ == "__main__":
    main()
