"""Score's boundary split and Rerank's arithmetic (pure logic, no MLX, no model)."""

import math
import re
from dataclasses import dataclass, field

import pytest
from hypothesis import given, strategies as st

from common.python_utils import OptionError
from engine import EngineError
from loaders.loaded import SERVES
from prepare import forward as forward_prep


class WordTokenizer:
    """Words with their leading space, as BPE vocabularies have them: "I go" + "ing" re-splits
    into "I", " going", so a candidate can merge with the prompt's last token."""
    bos_token = None
    bos_token_id = 0

    def __init__(self):
        self.vocab = {"<s>": 0}

    def encode(self, text, add_special_tokens=True):
        ids = [0] if add_special_tokens else []
        for piece in re.findall(r" ?\w+| ?[^\w ]| ", text):
            ids.append(self.vocab.setdefault(piece, len(self.vocab)))
        return ids

    def __len__(self):
        return len(self.vocab)


@dataclass
class FakeLM:
    tokenizer: WordTokenizer = field(default_factory=WordTokenizer)
    context_size: int = 1000
    kind: str = "text"
    epoch: int = 1
    options: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    @property
    def serves(self):  # as LoadedModel declares it
        return SERVES[self.kind]


text = st.text(alphabet="ab .", min_size=1, max_size=12)


@given(prompt=text, candidates=st.lists(text, min_size=1, max_size=6))
def test_rows_rebuild_each_candidate_and_score_only_what_it_adds(prompt, candidates):
    lm = FakeLM()
    tok = lm.tokenizer
    job = forward_prep.score_job(lm, prompt, candidates)
    p = tok.encode(prompt)
    for i, cand in enumerate(candidates):
        full = tok.encode(prompt + cand)
        # The shared KV, then the row, then the last target: the whole text, in order.
        assert job.shared + job.rows[i] + job.targets[i][-1:] == full
        assert len(job.rows[i]) == len(job.targets[i])
        # Targets are the next tokens of the rows (the model predicts each from the one before).
        assert job.targets[i][:-1] == job.rows[i][1:]
        # Scored: every token from the first one that differs from the prompt's own tokens.
        k = next((j for j, (x, y) in enumerate(zip(p, full)) if x != y), min(len(p), len(full)))
        assert job.targets[i][job.first[i]:] == full[k:]
    assert job.save_upto <= len(job.shared)


def test_a_merging_candidate_is_scored_from_the_merged_token():
    lm = FakeLM()
    job = forward_prep.score_job(lm, "I go", ["ing home", " away"])
    tok = lm.tokenizer
    assert job.targets[0][job.first[0]:] == [tok.vocab[" going"], tok.vocab[" home"]]
    assert job.targets[1][job.first[1]:] == [tok.vocab[" away"]]


def test_stable_prefix_keeps_only_its_own_tokens():
    lm = FakeLM()
    prompt = "one two three four"
    job = forward_prep.score_job(lm, prompt, [" five"], stable_prefix_len=len("one two"))
    # "one two" may merge with what follows, so the cache keeps "<s> one" at most.
    assert job.save_upto == 2
    assert forward_prep.score_job(lm, prompt, [" five"]).save_upto == len(job.shared)


@pytest.mark.parametrize("prompt,candidates,stable", [
    ("", ["x"], 0), ("p", [], 0), ("p", ["x", ""], 0), ("p", ["x"] * 257, 0), ("p", ["x"], 2), ("p", ["x"], -1)])
def test_bad_score_input_is_refused(prompt, candidates, stable):
    with pytest.raises(OptionError):
        forward_prep.score_job(FakeLM(), prompt, candidates, stable)


def test_too_long_is_resource_exhausted():
    with pytest.raises(EngineError) as e:
        forward_prep.score_job(FakeLM(context_size=5), "a b c d e f", [" g"])
    assert e.value.code == "RESOURCE_EXHAUSTED"


def test_an_embedding_model_cannot_score():
    with pytest.raises(OptionError):
        forward_prep.score_job(FakeLM(kind="embedding"), "p", ["x"])


@given(st.floats(-50, 0), st.floats(-50, 0))
def test_relevance_is_the_yes_share(yes, no):
    r = forward_prep.relevance(yes, no)
    assert r == pytest.approx(math.exp(yes) / (math.exp(yes) + math.exp(no)), rel=1e-9, abs=1e-300)
    assert (r >= 0.5) == (yes >= no) or abs(yes - no) < 1e-12


@given(st.lists(st.floats(-10, 10), min_size=3, max_size=3), st.lists(st.floats(-10, 10), min_size=3, max_size=3))
def test_cosine_is_bounded_and_symmetric(a, b):
    c = forward_prep.cosine(a, b)
    assert -1.0 - 1e-9 <= c <= 1.0 + 1e-9
    assert c == pytest.approx(forward_prep.cosine(b, a))
