"""End-to-end: Score passes sized by what they compute, for a plain and a quantized KV cache.

32 one-token candidates after a prompt of ~400 tokens, through the real server
with SmolLM2 loaded in float32, once with its own cache and once with
`CacheTypeKey/Value: q8_0`. The oracle is the library: mlx-lm's model in a process
of its own with the server's BLAS (score_oracle.py), one forward pass over the
prompt, log-softmax at its last position, each candidate's token picked; for q8_0
the prompt but its last token is prefilled in float and its cache quantized by
mlx-lm's `to_quantized` (as mlx-lm's own generation quantizes after the prompt)
before the last token runs. The server's resident high-water mark during the call
stays under a bound (a pass that recomputes the prompt with vocabulary-wide logits
per candidate would cost hundreds of MB per row).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import backend_pb2
from conftest import serving
from peak_rss import peak_growth_mb

pytestmark = pytest.mark.e2e

WORDS = ("apple river stone cloud garden window silver market forest engine candle mirror harbor "
         "ladder pepper castle blanket thunder meadow violin bottle feather lantern island rocket "
         "saddle tunnel walnut anchor basket copper marble orange planet summer winter yellow").split()
PEAK_MB = 200  # resident growth allowed for the whole call
TIME_S = 60  # well under it on this machine when the passes are sized right


def prompt_text():
    sentences = ["The old harbor town woke slowly under a grey sky.",
                 "Fishermen checked their nets while gulls circled above the boats.",
                 "A baker opened her shop and the smell of bread filled the street.",
                 "Children ran past the fountain on their way to the school by the hill.",
                 "In the evening the lamps were lit one by one along the quay."]
    return " ".join(sentences[i % len(sentences)] for i in range(34)) + " The word I am thinking of is"


@pytest.fixture(scope="module")
def case():
    """(prompt, 32 candidates of one token each, their log-probs by a direct forward pass:
    float, and with the prompt's KV quantized to 8 bits as mlx-lm quantizes it after a float
    prefill), the passes run by score_oracle.py in a process with the server's BLAS."""
    from transformers import AutoTokenizer

    from family_oracle import server_blas_env
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    tok = AutoTokenizer.from_pretrained(str(gguf_to_mlx_dir(embedded_default())))
    prompt = prompt_text()
    p = tok(prompt)["input_ids"]
    assert 380 <= len(p) <= 480, len(p)
    cands, ids = [], []
    for w in WORDS:
        full = tok(prompt + " " + w)["input_ids"]
        if full[:len(p)] == p and len(full) == len(p) + 1:
            cands.append(" " + w)
            ids.append(full[-1])
    assert len(cands) >= 32
    cands, ids = cands[:32], ids[:32]
    out = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "score_oracle.py")],
                         input=json.dumps({"prompt": p, "candidates": ids}), capture_output=True, text=True,
                         env=server_blas_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    ref = json.loads(out.stdout)
    return prompt, cands, ref["plain"], ref["q8"]


@pytest.fixture(scope="module")
def plain(log_dir):
    from loaders.model_loader import embedded_default

    yield from serving(log_dir / "score-plain.log", embedded_default(), DType="float32")


@pytest.fixture(scope="module")
def q8(log_dir):
    from loaders.model_loader import embedded_default

    # The prompt in one forward chunk, as the oracle prefills it (each later chunk of a longer
    # prefill would attend to the 8-bit keys of the earlier ones).
    yield from serving(log_dir / "score-q8.log", embedded_default(), DType="float32",
                       CacheTypeKey="q8_0", CacheTypeValue="q8_0", Options=["forward_chunk_tokens:1024"])


def score_bounded(server, prompt, cands):
    t0 = time.monotonic()
    got, peak = peak_growth_mb(server.proc.pid, lambda: server.stub.Score(
        backend_pb2.ScoreRequest(prompt=prompt, candidates=cands), timeout=600).candidates)
    took = time.monotonic() - t0
    assert peak < PEAK_MB, f"the server's resident memory rose {peak:.0f} MB during one Score"
    assert took < TIME_S, f"one Score took {took:.0f} s"
    assert [c.num_tokens for c in got] == [1] * len(cands)
    return [c.log_prob for c in got]


def test_plain_cache_scores_equal_the_direct_pass_within_bounded_memory(plain, case):
    prompt, cands, ref, _ = case
    assert score_bounded(plain, prompt, cands) == pytest.approx(ref, abs=1e-4)


def test_q8_cache_scores_equal_the_direct_pass_within_bounded_memory(q8, case):
    prompt, cands, plain_ref, ref = case
    got = score_bounded(q8, prompt, cands)
    # Float differences of ~1e-6 (the server's passes are chunked and batched, the oracle's one
    # plain pass) can move a few 8-bit rounding steps of the keys, ~1e-2 in a log-prob.
    assert got == pytest.approx(ref, abs=0.03)
    off_q8, off_float = (np.abs(np.array(got) - np.array(r)).mean() for r in (ref, plain_ref))
    assert off_q8 < off_float / 2, (off_q8, off_float)  # the 8-bit cache was the one read
