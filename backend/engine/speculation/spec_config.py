"""Speculative decoding settings of a loaded model, and its draft model (loader thread).

Options (ModelOptions.Options): `speculation:off|lookup|draft` (default: draft
when ModelOptions.DraftModel is set, else lookup), `n_draft` (tokens proposed
per step; a request's NDraft wins), `ngram_size` (longest n-gram prompt lookup
matches, default 3) and `ngram_min` (shortest, default 1).
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from common.python_utils import OptionError

DEFAULT_DRAFT = {"lookup": 6, "draft": 3}


@dataclass(frozen=True)
class Settings:
    mode: str = "lookup"
    n_draft: int = DEFAULT_DRAFT["lookup"]
    ngram_max: int = 3
    ngram_min: int = 1
    draft: Any = None  # the draft model's LoadedModel, mode "draft" only


def parse(options, draft_model: str = "") -> Settings:
    """The settings a LoadModel asks for, from load_options.Settings (each value already
    checked against its range); OptionError names what does not go together."""
    mode = options.speculation
    if mode in (None, "auto"):
        mode = "draft" if draft_model else "lookup"
    if mode == "draft" and not draft_model:
        raise OptionError("option speculation:draft needs ModelOptions.DraftModel")
    n_draft = options.n_draft or DEFAULT_DRAFT.get(mode, 0)
    if options.ngram_min > options.ngram_size:
        raise OptionError(f"option ngram_min: must be <= ngram_size ({options.ngram_size}), got {options.ngram_min}")
    return Settings(mode=mode, n_draft=n_draft, ngram_max=options.ngram_size, ngram_min=options.ngram_min)


def same_vocabulary(a, b) -> bool:
    """Whether two tokenizers map every token to the same id (drafts are exchanged as ids)."""
    try:
        return a.get_vocab() == b.get_vocab()
    except (AttributeError, NotImplementedError):
        return len(a) == len(b)


def with_draft(settings: Settings, lm, spec, draft_model: str) -> Settings:
    """The settings LoadModel builds `lm`'s value with (loader thread): with mode draft, a copy
    holding the draft model, loaded by the same loaders with the same dtype rule."""
    from loaders import model_loader

    if settings.mode != "draft":
        return settings
    draft_spec = model_loader.LoadSpec(
        model=draft_model, model_path=spec.model_path, dtype=spec.dtype,
        context_size=lm.context_size, trust_remote_code=spec.trust_remote_code)
    try:
        draft = model_loader.load(draft_spec)
    except model_loader.ModelNotFound as e:
        raise model_loader.ModelNotFound(f"DraftModel: {e}") from None
    except model_loader.ModelLoadError as e:
        raise model_loader.ModelLoadError(f"DraftModel: {e}") from None
    if not same_vocabulary(lm.tokenizer, draft.tokenizer):
        raise model_loader.ModelLoadError(
            f"DraftModel: {draft.source} does not share the vocabulary of {lm.source} "
            "(a draft model must use the same tokenizer)")
    return dataclasses.replace(settings, draft=draft)


def settings_of(lm) -> Settings:
    """The settings `lm` was loaded with (LoadedModel.speculation; the defaults without LoadModel)."""
    return getattr(lm, "speculation", None) or Settings()
