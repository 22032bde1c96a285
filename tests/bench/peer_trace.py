"""A seeded chat workload: when each request arrives, what it asks and how many tokens it may take.

Short questions and long documents to summarise, written here from seeded word lists (nothing
is downloaded), so a trace is the same on every machine for the same knobs. Arrivals are a
Poisson process at a rate, or all at once (rate 0).
"""

import random
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence


@dataclass(frozen=True)
class TraceRequest:
    index: int
    arrival_s: float  # after the trace's start
    kind: str  # "chat" or "document" (the bench's warm-up request: "warm-up")
    prompt: str  # the user message
    max_tokens: int
    temperature: float  # 0: greedy
    seed: int  # the host's random seed for the request


@dataclass(frozen=True)
class TraceSpec:
    requests: int = 32
    rate: float = 0.5  # arrivals per second; 0: all at once
    document_share: float = 0.5
    min_tokens: int = 32
    max_tokens: int = 128
    document_tokens: int = 400
    temperature: float = 0.0
    seed: int = 0


PLACES = ["the harbour town of Velmar", "a mountain village", "the river delta", "an island observatory",
          "the old mill district", "a desert research station", "the northern rail depot", "a hillside vineyard"]
PEOPLE = ["the engineer", "the mayor", "a young teacher", "the night nurse", "an apprentice baker",
          "the ferry captain", "a retired surveyor", "the librarian"]
THINGS = ["the water pumps", "the solar panels", "the grain stores", "the signal lights", "the bridge cables",
          "the school roof", "the orchard", "the weather station", "the fishing boats", "the power lines"]
ACTIONS = ["inspected", "repaired", "measured", "rebuilt", "cleaned", "tested", "replaced", "painted"]
REASONS = ["after the spring floods", "before the winter storms", "because the budget finally allowed it",
           "when the old parts failed", "to prepare for the festival", "after complaints from residents",
           "as the council had promised", "because the inspectors insisted"]
RESULTS = ["costs fell by a third", "the work took two weeks longer than planned", "nobody was hurt",
           "the neighbours helped every evening", "the results surprised everyone", "a second team was hired",
           "the records were finally updated", "the town saved enough to start another project"]
TOPICS = ["photosynthesis", "the water cycle", "a steam engine", "compound interest", "the immune system",
          "a rainbow", "tides", "a refrigerator", "volcanoes", "the printing press", "bread rising",
          "an electric motor", "bird migration", "a lighthouse", "recycling paper", "the seasons"]
QUESTIONS = ["How does {t} work?", "Explain {t} to a ten-year-old.", "What are three facts about {t}?",
             "Why is {t} important?", "Give me a short history of {t}.", "What is a common mistake about {t}?"]


def _sentence(rng: random.Random) -> str:
    return (f"In {rng.choice(PLACES)}, {rng.choice(PEOPLE)} {rng.choice(ACTIONS)} {rng.choice(THINGS)} "
            f"{rng.choice(REASONS)}, and {rng.choice(RESULTS)}.")


def document(rng: random.Random, tokens: int, count: Optional[Callable[[str], int]]) -> str:
    """Sentences until the text reaches `tokens` (by `count`, else ~24 tokens a sentence)."""
    title = f"Report {rng.randrange(1000, 10000)}: {rng.choice(THINGS)} of {rng.choice(PLACES)}."
    parts = [title]
    while (count(" ".join(parts)) if count else 24 * (len(parts) - 1)) < tokens:
        parts.append(_sentence(rng))
    return " ".join(parts)


def generate(spec: TraceSpec, count: Optional[Callable[[str], int]] = None) -> List[TraceRequest]:
    """The trace for `spec`; `count` (text -> tokens) sizes the documents exactly when given."""
    rng = random.Random(spec.seed)
    out, t, asked = [], 0.0, set()
    for i in range(spec.requests):
        if spec.rate > 0 and i > 0:
            t += rng.expovariate(spec.rate)
        if rng.random() < spec.document_share:
            kind = "document"
            prompt = "Summarise this report in a few sentences.\n\n" + document(rng, spec.document_tokens, count)
        else:
            kind = "chat"
            prompt = rng.choice(QUESTIONS).format(t=rng.choice(TOPICS))
            while prompt in asked and len(asked) < len(QUESTIONS) * len(TOPICS):  # a repeat would be served warm
                prompt = rng.choice(QUESTIONS).format(t=rng.choice(TOPICS))
            asked.add(prompt)
        out.append(TraceRequest(index=i, arrival_s=round(t, 3), kind=kind, prompt=prompt,
                                max_tokens=rng.randint(spec.min_tokens, spec.max_tokens),
                                temperature=spec.temperature, seed=rng.randrange(1, 2 ** 31 - 1)))
    return out


def all_at_once(trace: Sequence[TraceRequest]) -> List[TraceRequest]:
    """The same requests, every one arriving at the start."""
    return [replace(r, arrival_s=0.0) for r in trace]
