"""Embedding, Score and Rerank requests -> forward jobs, and Rerank's scores from their results
(preparation thread, no MLX).

Tokenizing and every check of the input happen here; the engine gets jobs
it can run as they are. Bad input raises OptionError (INVALID_ARGUMENT) or
EngineError (RESOURCE_EXHAUSTED for inputs longer than the context). What a
model serves is asked of `lm.serves`; how it judges relevance (rerank_method)
is decided here, for both the jobs and the scores.
"""

import math
from typing import List, Sequence, Tuple

from common.python_utils import OptionError
from engine import EngineError
from engine.forward.pair_forward import PairJob
from engine.forward.passes import EmbedJob, ScoreJob
import limits
import load_options

from .render_guard import bounded


# The Qwen3-Reranker recipe: the model judges relevance with "yes" or "no".
RERANK_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct '
                 'provided. Note that the answer can only be "yes" or "no".')
RERANK_INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"


def _options(lm) -> load_options.Settings:
    """The model's load options, every row's default for those not set."""
    return load_options.settings(lm.options)


def _fits(lm, n: int, what: str) -> None:
    if n > lm.context_size:
        raise EngineError("RESOURCE_EXHAUSTED", f"{what} is {n} tokens; the context holds {lm.context_size}")


def check_bytes(lm, field: str, texts: Sequence[str]) -> None:
    """The request's texts bounded in bytes before any is tokenized (or rendered)."""
    bound = limits.of(lm).max_prompt_bytes
    size = sum(len(t.encode("utf-8")) for t in texts)
    if size > bound:
        raise OptionError(f"{field}: {size} bytes; at most {bound} (option max_prompt_bytes)")


def encode_text(lm, text: str) -> List[int]:
    """Token ids of a text as the model reads a whole input (its BOS, or [CLS] .. [SEP])."""
    tok = lm.tokenizer
    bos = getattr(tok, "bos_token", None)
    return list(tok.encode(text, add_special_tokens=not (bos and text.startswith(bos))))


def embed_inputs(lm, texts: Sequence[str], names: Sequence[str]) -> List[List[int]]:
    out = []
    for text, name in zip(texts, names):
        if not text:
            raise OptionError(f"{name}: empty")
        tokens = encode_text(lm, text)
        if not tokens:
            raise OptionError(f"{name}: it tokenizes to nothing")
        _fits(lm, len(tokens), name)
        out.append(tokens)
    return out


def embed_job(lm, opts) -> EmbedJob:
    """Embedding(PredictOptions): the text in `Embeddings`, or token ids in `EmbeddingTokens`."""
    serves = lm.serves
    if not serves.embed:
        raise OptionError(f"Embedding: the loaded model is {serves.what}; it serves {served_rpcs(serves)} only")
    if opts.EmbeddingTokens:
        _fits(lm, len(opts.EmbeddingTokens), "EmbeddingTokens")  # counted before they are scanned
        vocab = int(lm.config.get("vocab_size") or len(lm.tokenizer))
        bad = [t for t in opts.EmbeddingTokens if not 0 <= t < vocab]
        if bad:
            raise OptionError(f"EmbeddingTokens: ids out of range [0, {vocab}): {bad[:5]}")
        inputs = [list(opts.EmbeddingTokens)]
    else:
        text = opts.Embeddings or opts.Prompt
        if not text:
            raise OptionError("Embeddings: empty (send the text in Embeddings, or EmbeddingTokens)")
        check_bytes(lm, "Embeddings", [text])
        inputs = embed_inputs(lm, [text], ["Embeddings"])
    spec = lm.embedding
    return EmbedJob(inputs=inputs, pooling=spec.pooling, normalize=spec.normalize,
                    model_epoch=lm.epoch, label=opts.CorrelationId)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _needs_causal_lm(lm, rpc: str) -> None:
    if not lm.serves.score:
        raise OptionError(f"{rpc}: the loaded model is {lm.serves.what}; {rpc} needs a causal language model")


def score_job(lm, prompt: str, candidates: Sequence[str], stable_prefix_len: int = 0,
              label: str = "") -> ScoreJob:
    """Each candidate scored as the model would generate it after `prompt`.

    prompt+candidate is tokenized as one text and split where its tokens stop
    matching the prompt's own: a candidate whose first characters merge with
    the prompt's last token (" Paris" after "is", or "ing" after "go") is
    scored from that merged token on, as the model would produce it.
    """
    _needs_causal_lm(lm, "Score")
    limit = _options(lm).max_candidates  # per Score call (its default: load_options' table)
    if not candidates:
        raise OptionError("candidates: empty (send at least one)")
    if len(candidates) > limit:
        raise OptionError(f"candidates: {len(candidates)} given; at most {limit} per call")
    if not prompt:
        raise OptionError("prompt: empty (a candidate is scored after a prompt)")
    for i, c in enumerate(candidates):
        if not c:
            raise OptionError(f"candidates[{i}]: empty")
    check_bytes(lm, "prompt and candidates", [prompt, *candidates])
    raw = prompt.encode("utf-8")
    if not 0 <= stable_prefix_len <= len(raw):
        raise OptionError(f"stable_prefix_len: must be within [0, {len(raw)}] (the prompt's bytes), "
                          f"got {stable_prefix_len}")
    p = encode_text(lm, prompt)
    full = [encode_text(lm, prompt + c) for c in candidates]
    _fits(lm, max(len(f) for f in full), "prompt + the longest candidate")
    splits = [_common_prefix(p, f) for f in full]
    for i, (k, f) in enumerate(zip(splits, full)):
        if k >= len(f):
            raise OptionError(f"candidates[{i}]: adds no token to the prompt")
    s = min(splits)
    if s == 0:
        raise OptionError("prompt: the candidates leave no prompt token to condition on")
    # Rows start at the last common token, whose logits predict the first token that differs.
    shared = p[:s - 1]
    save = len(shared)
    if stable_prefix_len:
        stable = encode_text(lm, raw[:stable_prefix_len].decode("utf-8", errors="ignore"))
        # Its last token may merge with what follows it: only tokens the prompt has too.
        save = min(save, max(0, _common_prefix(stable, p) - 1))
    return ScoreJob(shared=shared, rows=[f[s - 1:-1] for f in full], targets=[f[s:] for f in full],
                    first=[k - s for k in splits], save_upto=save, model_epoch=lm.epoch, label=label)


def score_request(lm, req) -> ScoreJob:
    return score_job(lm, req.prompt, list(req.candidates), req.stable_prefix_len)


def rerank_prompt(lm, query: str, document: str) -> Tuple[str, int]:
    """The relevance question for one document, and the byte length of its part before the document."""
    instruct = _options(lm).rerank_instruct
    instruct = RERANK_INSTRUCT if instruct is None else instruct
    head = f"<Instruct>: {instruct}\n<Query>: {query}\n<Document>: "
    user = head + document
    tok = lm.tokenizer
    if getattr(tok, "has_chat_template", False) or getattr(tok, "chat_template", None):
        messages = [{"role": "system", "content": RERANK_SYSTEM}, {"role": "user", "content": user}]
        bound = limits.of(lm)
        with bounded("query", bound.template_seconds, bound.template_output_bytes):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            mark = "\x00doc\x00"  # where the document sits in the rendered text
            probe = tok.apply_chat_template(
                [messages[0], {"role": "user", "content": head + mark}], add_generation_prompt=True,
                tokenize=False)
        before = probe.split(mark, 1)[0] if mark in probe else ""
    else:
        text = f"{RERANK_SYSTEM}\n\n{user}\n\nAnswer: "
        before = f"{RERANK_SYSTEM}\n\n{head}"
    stable = len(before.encode("utf-8")) if text.startswith(before) else 0
    return text, stable


def check_documents(lm, query: str, documents: Sequence[str], top_n: int) -> None:
    if not query:
        raise OptionError("query: empty")
    if not documents:
        raise OptionError("documents: empty (send at least one)")
    limit = _options(lm).max_documents  # per Rerank call
    if len(documents) > limit:
        raise OptionError(f"documents: {len(documents)} given; at most {limit} per call")
    if top_n < 0:
        raise OptionError(f"top_n: must be >= 0 (0 = all), got {top_n}")


def pair_job(lm, query: str, documents: Sequence[str]) -> PairJob:
    """A cross-encoder's inputs: each (query, document) pair joined as its tokenizer joins a
    sentence pair ([CLS] query [SEP] document [SEP], segments 0 then 1, for BERT)."""
    tok = lm.tokenizer
    inputs, types = [], []
    for i, d in enumerate(documents):
        if not d:
            raise OptionError(f"documents[{i}]: empty")
        enc = tok(query, d)
        inputs.append(list(enc["input_ids"]))
        types.append(list(enc["token_type_ids"]) if "token_type_ids" in enc else None)
        _fits(lm, len(inputs[-1]), f"query + documents[{i}]")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return PairJob(inputs=inputs, types=None if types[0] is None else types, pad_id=pad, model_epoch=lm.epoch)


def rerank_method(lm) -> str:
    """How the model judges relevance: "yes_no" (a causal LM asked about each document),
    "cosine" (an embedding model: query against each document) or "pair" (a cross-encoder)."""
    serves = lm.serves
    if serves.score:
        return "yes_no"
    return "cosine" if serves.embed else "pair"


def rerank_jobs(lm, req) -> list:
    """An embedding job of the query and the documents, a cross-encoder's pair job, or one
    yes/no score job per document."""
    documents = list(req.documents)
    check_documents(lm, req.query, documents, req.top_n)
    check_bytes(lm, "query and documents", [req.query, *documents])
    method = rerank_method(lm)
    if method == "pair":
        return [pair_job(lm, req.query, documents)]
    if method == "cosine":
        inputs = embed_inputs(lm, [req.query] + documents,
                              ["query"] + [f"documents[{i}]" for i in range(len(documents))])
        pooling = lm.embedding.pooling if lm.embedding.pooling != "none" else "mean"
        return [EmbedJob(inputs=inputs, pooling=pooling, normalize=True, model_epoch=lm.epoch)]
    for i, d in enumerate(documents):
        if not d:
            raise OptionError(f"documents[{i}]: empty")
    jobs = []
    for d in documents:
        text, stable = rerank_prompt(lm, req.query, d)
        jobs.append(score_job(lm, text, ["yes", "no"], stable))
    return jobs


def rerank_scores(lm, results) -> List[float]:
    """Each document's relevance from the results of rerank_jobs' jobs, in document order."""
    method = rerank_method(lm)
    if method == "cosine":
        (query, *docs) = [v[0] for v in results[0].vectors]
        return [cosine(query, d) for d in docs]
    if method == "pair":  # sigmoid of the classifier's logit, per document
        return list(results[0].scores)
    return [relevance(sum(r.logprobs[0]), sum(r.logprobs[1])) for r in results]


def ranked(scores: Sequence[float], top_n: int) -> List[int]:
    """Document indices, most relevant first; the first `top_n` of them when it is set."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n > 0 else order


def served_rpcs(serves) -> str:
    """The RPCs a model serves, as refusals list them: "Embedding and Rerank"."""
    names = [name for name, yes in (("Predict", serves.generate), ("Embedding", serves.embed),
                                    ("Score", serves.score), ("Rerank", serves.rerank),
                                    ("AudioTranscription", "transcribe" in serves.audio),
                                    ("TTS", "speak" in serves.audio), ("VAD", "detect" in serves.audio)) if yes]
    return " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]


def relevance(yes: float, no: float) -> float:
    """P("yes") between the two answers, from their log-probabilities."""
    top = max(yes, no)
    a, b = math.exp(yes - top), math.exp(no - top)
    return a / (a + b)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / max(na * nb, 1e-12)
