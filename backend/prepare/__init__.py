"""Preparation: a request's proto -> the work the engine runs (the preparation thread, no MLX).

    spec.py      a generation request's PredictOptions read once, with the model's defaults
    text.py      prompt rendering, tokenizing and the checks -> engine Request (build_request)
    sampling.py  sampling settings: fields checked, the model's defaults filled in
    vision.py    a vision model's prompt: media placed and expanded into its tokens
    media.py     base64 items -> images, their content hashes
    forward.py   Embedding, Score and Rerank -> forward jobs; Rerank's scores from their results
    render_guard.py  a chat-template render bounded in time and output
    probe.py     the short requests LoadModel runs to check a model's lane
    faults.py    faults a test asks for (fault-isolation tests only)

Imports run downward only: engine, loaders, common and the load options; never the servicer.
"""

from .forward import embed_job, rerank_jobs, rerank_scores, ranked, score_request, served_rpcs
from .media import MEDIA_MARKER
from .probe import probe_requests
from .spec import RequestSpec, read
from .text import build_request, prompt_tokens

__all__ = ["MEDIA_MARKER", "RequestSpec", "build_request", "embed_job", "probe_requests", "prompt_tokens", "ranked",
           "read", "rerank_jobs", "rerank_scores", "score_request", "served_rpcs"]
