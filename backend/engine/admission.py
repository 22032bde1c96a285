"""Admission: which requests may wait, which may run, and how much KV each reserves.

A request is refused at once when the queue is full or it could never fit the KV budget;
otherwise it waits, in order, until its KV reservation is free (max_sequences is only an
upper bound) and its first prefill chunk fits the step's prefill budget next to the requests
still prefilling, so a step's cost stays bounded and running streams keep their pace.
Engine thread only (the figures are the scheduler's).
"""

import logging
from typing import Optional

from engine import kv_budget

log = logging.getLogger("mlx-backend.engine")

# An open-ended request reserves at most this share of the KV budget (fewer when fewer
# places): max_sequences is an upper bound, not the expected company, so a share of
# budget / max_sequences would cut such requests short for no one (1/8: the old default's).
OPEN_ENDED_SHARES = 8


class Admission:
    """The KV budget of the current model and the bounds of the queue (config)."""

    def __init__(self):
        self.budget = 0  # KV bytes running requests may reserve (0: no bound); set at each swap

    def reset(self, model, config, mx) -> None:
        """At a swap: the budget for `model` (None: nothing served)."""
        budget = config.kv_budget_bytes
        self.budget = kv_budget.default_budget(mx) if budget is None and model is not None else budget or 0
        if getattr(model, "kv_bytes_per_token", 0) and self.budget:
            log.info("KV budget: %d bytes (%d tokens at %d bytes/token)", self.budget,
                     self.budget // model.kv_bytes_per_token, model.kv_bytes_per_token)

    def reserve(self, request, lm, config, places: int, running: int, waiting: int) -> tuple:
        """(KV bytes to reserve, why it is refused or None) for a model whose lane runs `places`
        requests at once. Shortens an open-ended request to what the budget leaves it."""
        per_token = getattr(lm, "kv_bytes_per_token", 0) if self.budget else 0
        if request.open_ended and per_token:
            # Reserving to the end of a long context would take the whole budget and run
            # requests one at a time: an open-ended one gets its share of the budget (or,
            # with a prompt longer than a share, the rest of the whole budget) and ends
            # "length" there, never past what was reserved.
            share = self.budget // min(places, OPEN_ENDED_SHARES) // per_token - len(request.prompt)
            fits = share if share > 0 else self.budget // per_token - len(request.prompt)
            if 0 < fits < request.max_tokens:
                request.max_tokens = fits
        need = kv_budget.need(len(request.prompt), request.max_tokens, per_token)
        return need, self._refusal(request, need, per_token, config, places, running, waiting)

    def _refusal(self, request, need: int, per_token: int, config, places: int, running: int,
                 waiting: int) -> Optional[str]:
        """Why a request cannot even wait (the queue is full, it could never fit), or None."""
        free = max(places - running, 0)  # those it fills are admitted this pass
        if waiting >= free + config.max_waiting:
            return (f"{waiting} requests are already waiting for a place in the batch "
                    f"(bound: option max_waiting={config.max_waiting}); retry later")
        if need > self.budget > 0:
            return kv_budget.refusal(len(request.prompt), request.max_tokens, per_token, self.budget)
        return None

    @staticmethod
    def prefill_fits(slot, running, sizes, left=lambda s: None) -> bool:
        """Whether its first prefill chunk fits one step's prefill budget next to the chunks of
        the running requests still prefilling (always, when none is: it then runs alone
        whatever its size). The budget is sizes.step_tokens while some stream decodes (its pace
        is what the bound keeps), sizes.idle_tokens while none does (a burst arriving together
        is prefilled together, as the library's batch_generate prefills it). Its prompt counts
        whole: what the prefix cache serves is only known once it is admitted.

        `left(s)`: the prompt tokens a running request has still to prefill, as its batch
        knows them (None: not known; its uncached prompt counts then). One whose chunks are
        all done takes no room: its last token goes in with the next decode, so the next
        prompt's first chunk is prefilled in that same step rather than two steps later.

        A chunk here is sizes.backlog_size: what a prompt takes of a step while others wait,
        as they do whenever admission runs."""
        def chunk(s) -> int:
            rest = left(s)
            return min(len(s.request.prompt) - s.cached if rest is None else rest, sizes.backlog_size)

        pending = [c for c in (chunk(s) for s in running if not s.t_first) if c > 0]
        budget = sizes.step_tokens if len(pending) < len(running) else sizes.idle_tokens
        return not pending or sum(pending) + min(len(slot.request.prompt), sizes.backlog_size) <= budget

    def fits(self, slot, running) -> bool:
        """Whether its KV reservation fits next to the running requests' (always, with no budget)."""
        reserved = sum(s.kv_bytes for s in running)
        return not self.budget or reserved + slot.kv_bytes <= self.budget
