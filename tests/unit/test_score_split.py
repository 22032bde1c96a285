"""Score on a model whose output depends on how a sequence is split between passes (mlx-lm's
phi3small: its block-sparse layers let a position see later tokens of its pass): each
candidate's log-probs equal the model's own one pass over prompt + candidate, not the prompt's
cache continued; a model that computes each position the same however it is split keeps the
shared prompt's cache."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx_lm.models import llama, phi3small  # noqa: E402

from engine.forward.passes import ForwardWork, ScoreJob, ScoreResult  # noqa: E402
from engine.forward.split_check import split_sensitive  # noqa: E402
from loaders.loaded import SERVES, Memo  # noqa: E402

PHI3SMALL_VOCAB = 100352  # its head masks ids up to 100351


def block_sparse_model():
    return phi3small.Model(phi3small.ModelArgs(
        model_type="phi3small", hidden_size=32, dense_attention_every_n_layers=2, ff_intermediate_size=64,
        gegelu_limit=20.0, num_hidden_layers=2, num_attention_heads=4, layer_norm_epsilon=1e-5,
        vocab_size=PHI3SMALL_VOCAB, num_key_value_heads=2))


def causal_model():
    return llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2,
        rms_norm_eps=1e-5, vocab_size=300, num_key_value_heads=1))


class LM:
    tokenizer, kv_bytes_per_token, epoch, serves = None, 0, 1, SERVES["text"]

    def __init__(self, model, vocab):
        self.model, self.config, self.memo = model, {"vocab_size": vocab}, Memo()


class Calls:
    """The model, recording the length of every pass it runs."""

    def __init__(self, model):
        self.model, self.lengths, self.layers, self.parameters = model, [], model.layers, model.parameters

    def __call__(self, ids, cache=None):
        self.lengths.append(ids.shape[1])
        return self.model(ids, cache=cache)


def one_pass(model, full, start):
    """log P(full[i] | full[:i]) summed for i >= start, from one pass over the sequence (the oracle)."""
    x = np.array(model(mx.array([full])).astype(mx.float32)[0], dtype=np.float64)
    top = x.max(-1, keepdims=True)
    ls = x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))
    return sum(ls[i - 1, full[i]] for i in range(start, len(full)))


def scored(lm, job):
    work = ForwardWork()
    work.add(job, "sink")
    for _ in range(100):
        done = work.run_chunk(lm, 8, lambda: None, mx.default_stream(mx.default_device()))
        if done:
            ((_, result),) = done
            assert isinstance(result, ScoreResult), result
            return [sum(lp) for lp in result.logprobs]
    raise AssertionError("the score job never finished")


@pytest.mark.parametrize("build, vocab, sensitive", [(block_sparse_model, PHI3SMALL_VOCAB, True),
                                                     (causal_model, 300, False)])
def test_scores_equal_the_models_one_pass(build, vocab, sensitive):
    mx.random.seed(0)
    model = build()
    mx.eval(model.parameters())
    lm = LM(Calls(model), vocab)
    assert split_sensitive(lm) is sensitive
    rng = np.random.default_rng(2)
    prompt = rng.integers(1, 300, 20).tolist()
    cands = [rng.integers(1, 300, k).tolist() for k in (1, 4, 2)]
    full = [prompt + c for c in cands]
    s = len(prompt)
    job = ScoreJob(shared=prompt[:s - 1], rows=[f[s - 1:-1] for f in full], targets=[f[s:] for f in full],
                   first=[0] * 3, save_upto=0)
    lm.model.lengths.clear()
    got = scored(lm, job)
    assert got == pytest.approx([one_pass(model, f, s) for f in full], abs=1e-4)
    if sensitive:  # prompt and candidate in one pass each
        assert lm.model.lengths == [len(f) for f in full]
    else:  # the prompt in chunks of 8, then the rows continuing its cache
        assert max(lm.model.lengths) <= 8


def test_a_quantized_kv_cache_asked_for_is_no_split_sensitivity():
    # Its 8-bit keys of earlier passes move log-probabilities by design: the model itself
    # computes each position the same however the sequence is split, so Score keeps the
    # prompt's cache (a whole pass per candidate took a 32-candidate Score from seconds to minutes).
    from engine.kv.kv_rows import install
    from loaders.adapt_options import KVSpec

    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2,
        rms_norm_eps=1e-5, vocab_size=300, num_key_value_heads=1))
    mx.eval(model.parameters())
    install(model, KVSpec(bits=8, group_size=32))
    assert split_sensitive(LM(model, 300)) is False
