#!/usr/bin/env python3
"""`make bench-spec`: speculative decoding against raw mlx-lm, like for like, in the same run.

  (a) prompt lookup on input-grounded tasks (repeat a paragraph with one word
      changed; rename a variable in a ~300-token function): our single-stream
      decode tok/s with speculation on and off vs mlx_lm.stream_generate, and
      whether the greedy text is identical;
  (b) a draft model (the embedded model cut to its first --draft-layers
      layers, the only same-vocabulary pair installable here): our decode
      tok/s and accepted share vs mlx-lm's own stream_generate(draft_model=...)
      with the same number of draft tokens.

Raw mlx-lm runs in this process on the model loaded as our server loads it
(the same converted GGUF, the same dtype choice, OpenBLAS); the server is idle
meanwhile. Rounds interleave the sides; the table gives medians. Decode rate
on both sides is (tokens - 1) / (time from the first token to the last).
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO, os.path.join(REPO, "tests")]

PARAGRAPH = (
    "The river ran slowly through the valley in late summer. On its banks the farmers cut the "
    "hay and stacked it in long rows to dry in the sun. Children from the village came down to "
    "the river every afternoon to swim, and their parents watched them from the shade of the old "
    "willow trees. In the evening the cows walked back along the river path to the farm, where "
    "the milk was poured into cold metal cans and carried to the road before dark.")

FUNCTION = '''def summarize_orders(orders, tax_rate=0.2, discount=None):
    """Return the number of orders, the total before tax and the total after tax."""
    count = 0
    total = 0.0
    for order in orders:
        if order.get("cancelled"):
            continue
        count += 1
        price = order["price"] * order.get("quantity", 1)
        if discount is not None and order.get("code") == discount["code"]:
            price = price * (1.0 - discount["rate"])
        total += price
    taxed = total * (1.0 + tax_rate)
    if count == 0:
        return {"count": 0, "total": 0.0, "taxed": 0.0}
    average = total / count
    return {"count": count, "total": round(total, 2), "taxed": round(taxed, 2), "average": round(average, 2)}'''

TASKS = {
    "paragraph": f"Repeat the following paragraph exactly, changing only the word 'valley' to 'plain':\n\n{PARAGRAPH}",
    "code": ("Rewrite this Python function with the variable `total` renamed to `subtotal`, "
             f"changing nothing else:\n\n```python\n{FUNCTION}\n```"),
}


def raw_model(path: str):
    import mlx.core as mx
    from mlx_lm import load

    from loaders.model_loader import _cast, _choose_dtype

    model, tok = load(path)
    dtype = _choose_dtype("auto", model)
    if dtype:
        _cast(model, dtype)
    mx.clear_cache()
    return model, tok


def raw_decode(model, tok, ids, n, **kw):
    """stream_generate: (decode tok/s, text, tokens from the draft)."""
    from mlx_lm import stream_generate

    marks, text, drafted = [], [], 0
    for r in stream_generate(model, tok, ids, max_tokens=n, **kw):
        marks.append(time.perf_counter())
        text.append(r.text)
        drafted += bool(getattr(r, "from_draft", False))
    rate = (len(marks) - 1) / (marks[-1] - marks[0]) if len(marks) > 1 else 0.0
    return rate, "".join(text), drafted


def ours(stub, task, n, label, spec=True):
    from common.launcher import chat

    o = chat(TASKS[task], Tokens=n, CorrelationId=label)
    o.Metadata["speculation"] = "true" if spec else "false"
    r = stub.Predict(o, timeout=1200)
    rate = (r.tokens - 1) / (r.timing_token_generation / 1000.0) if r.timing_token_generation > 0 else 0.0
    return rate, r.message.decode(), r.tokens


def accepted(log_path, label):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if f"({label})" in line and "completion" in line:
                m = re.search(r"drafts accepted (\d+)/(\d+)", line)
                return (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return (0, 0)


def same(a: str, b: str) -> bool:
    # mlx-lm's detokenizer drops the first token's leading space; ours keeps it.
    return a.strip() == b.strip()


def main():
    from common.openblas import maybe_reexec_with_openblas

    maybe_reexec_with_openblas()
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=160)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n-draft", type=int, default=3)
    p.add_argument("--draft-layers", type=int, default=20)
    p.add_argument("--skip-draft", action="store_true")
    args = p.parse_args()

    from common.launcher import Backend, backend_pb2
    from draft_models import short_copy
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    model, tok = raw_model(str(gguf_to_mlx_dir(embedded_default())))
    log_path = os.path.join(tempfile.mkdtemp(prefix="bench-spec-"), "server.log")
    with Backend(log_path=log_path) as server:
        result = server.load(embedded_default())
        assert result.success, result.message
        ids = {t: list(server.stub.TokenizeString(backend_pb2.PredictOptions(
            Messages=[backend_pb2.Message(role="user", content=TASKS[t])], UseTokenizerTemplate=True)).tokens)
            for t in TASKS}
        print(f"(a) prompt lookup, {args.tokens} tokens, {args.rounds} rounds (medians)")
        print(f"{'task':10} {'prompt':>6} {'raw tok/s':>10} {'off tok/s':>10} {'on tok/s':>9} "
              f"{'on/raw':>7} {'accepted':>9} {'identical':>9}")
        for task in TASKS:
            rates = {"raw": [], "off": [], "on": []}
            texts, acc = {}, (0, 0)
            for r in range(args.rounds):
                order = ["raw", "off", "on"] if r % 2 == 0 else ["on", "off", "raw"]
                for side in order:
                    if side == "raw":
                        rate, texts["raw"], _ = raw_decode(model, tok, ids[task], args.tokens)
                    else:
                        label = f"bench-{task}-{side}-{r}"
                        rate, texts[side], _ = ours(server.stub, task, args.tokens, label, spec=side == "on")
                        if side == "on":
                            acc = accepted(log_path, label)
                    rates[side].append(rate)
            med = {k: statistics.median(v) for k, v in rates.items()}
            print(f"{task:10} {len(ids[task]):6d} {med['raw']:10.1f} {med['off']:10.1f} {med['on']:9.1f} "
                  f"{med['on'] / med['raw']:6.2f}x {acc[0]:4d}/{acc[1]:<4d} "
                  f"{str(same(texts['on'], texts['raw']) and same(texts['off'], texts['raw'])):>9}")

        if args.skip_draft:
            return
        draft_path = short_copy(args.draft_layers)
        draft, _ = raw_model(draft_path)
        result = server.load(embedded_default(), DraftModel=draft_path, Options=[f"n_draft:{args.n_draft}"])
        assert result.success, result.message
        print(f"\n(b) draft model: first {args.draft_layers} of the model's layers, {args.n_draft} draft tokens")
        print(f"{'task':10} {'raw-spec tok/s':>14} {'raw drafted':>11} {'ours tok/s':>10} {'ours drafted':>12} "
              f"{'ours/raw-spec':>13} {'identical':>9}")
        for task in TASKS:
            rates, texts, shares = {"raw": [], "ours": []}, {}, {}
            for r in range(args.rounds):
                for side in (["raw", "ours"] if r % 2 == 0 else ["ours", "raw"]):
                    if side == "raw":
                        rate, texts["raw"], drafted = raw_decode(model, tok, ids[task], args.tokens,
                                                                 draft_model=draft, num_draft_tokens=args.n_draft)
                        shares["raw"] = f"{drafted}"
                    else:
                        label = f"bench-draft-{task}-{r}"
                        rate, texts["ours"], n = ours(server.stub, task, args.tokens, label)
                        shares["ours"] = f"{accepted(log_path, label)[0]}/{n}"
                    rates[side].append(rate)
            raw_rate, our_rate = statistics.median(rates["raw"]), statistics.median(rates["ours"])
            print(f"{task:10} {raw_rate:14.1f} {shares['raw']:>11} {our_rate:10.1f} {shares['ours']:>12} "
                  f"{our_rate / raw_rate:12.2f}x {str(same(texts['ours'], texts['raw'])):>9}")


if __name__ == "__main__":
    main()
