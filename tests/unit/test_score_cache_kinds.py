"""Score rows over caches that are not plain KV (a sliding window that has wrapped, a recurrent
state), on tiny random mlx-lm models: the rows run only their own tokens on a copy of the
prompt's cache, and their log-probs equal the model's own pass over the whole sequence."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx_lm.models import gemma3_text, mamba  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from engine.forward.passes import ScoreJob, _body  # noqa: E402
from engine.forward.score_rows import score_rows as _score_rows  # noqa: E402

VOCAB = 300


def sliding_window_model():
    return gemma3_text.Model(gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=32, num_hidden_layers=4, intermediate_size=64,
        num_attention_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=VOCAB, num_key_value_heads=1,
        sliding_window=8, sliding_window_pattern=2))


def recurrent_model():
    return mamba.Model(mamba.ModelArgs(
        model_type="mamba", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, state_size=8,
        num_hidden_layers=2, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4,
        tie_word_embeddings=True))


class Recorder:
    """The model, recording the shape of every batch of ids it is called with."""

    def __init__(self, model):
        self.model, self.shapes, self.layers = model, [], model.layers

    def __call__(self, ids, cache=None):
        self.shapes.append(tuple(ids.shape))
        return self.model(ids, cache=cache)


def reference(model, full, start):
    """log P(full[i] | full[:i]) for i > start, from one pass of the model over the sequence."""
    x = np.array(model(mx.array([full[:-1]])).astype(mx.float32)[0], dtype=np.float64)
    top = x.max(-1, keepdims=True)
    ls = x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))
    return [ls[i - 1, full[i]] for i in range(start + 1, len(full))]


@pytest.mark.parametrize("build, kind", [(sliding_window_model, "RotatingKVCache"), (recurrent_model, "ArraysCache")])
def test_rows_continue_a_copy_of_the_prompts_cache(build, kind):
    mx.random.seed(0)
    model = build()
    mx.eval(model.parameters())
    rec = Recorder(model)

    class LM:
        config, tokenizer, kv_bytes_per_token = {"vocab_size": VOCAB}, None, 0

    lm = LM()
    lm.model = rec
    rng = np.random.default_rng(1)
    prompt = rng.integers(1, VOCAB, 40).tolist()
    cands = [rng.integers(1, VOCAB, k).tolist() for k in (1, 3, 2)]
    shared = prompt[:-1]
    cache = make_prompt_cache(model)
    assert kind in {type(c).__name__ for c in cache}
    for i in range(0, len(shared), 16):  # the prompt in chunks, past the window of 8
        _body(lm)(mx.array([shared[i:i + 16]]), cache=cache)
    rows = [[prompt[-1]] + c for c in cands]
    job = ScoreJob(shared=shared, rows=[r[:-1] for r in rows], targets=[r[1:] for r in rows],
                   first=[0] * 3, save_upto=0)
    got = list(_score_rows(lm, cache, job, 0, 3))
    assert rec.shapes == [(3, 3)]  # the rows' own tokens only, the prompt read from the copied cache
    for c, (tokens, logprobs) in zip(cands, got):
        assert tokens == c
        assert logprobs == pytest.approx(reference(model, prompt + c, len(prompt) - 1), abs=1e-5)
    # The prompt's own cache is left as it was: the next batch of rows copies it again.
    again = list(_score_rows(lm, cache, job, 0, 3))
    assert [x for _, lp in again for x in lp] == pytest.approx([x for _, lp in got for x in lp], abs=1e-6)
