"""How the engine serves a model (EngineConfig), built from the load options and checked there."""

import os
from dataclasses import dataclass, field
from typing import Optional


def _default_prompt_cache_bytes() -> int:
    """A tenth of the physical memory: room for many prefixes, far from the model's share."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 10
    except (ValueError, OSError, AttributeError):
        return 1 << 30


@dataclass
class EngineConfig:
    """How the engine serves a model: built from the load options (load_options), checked there."""
    # An upper bound a user may set; below it the KV budget decides (admission.py). 64 is twice
    # what the library's own server decodes at once (mlx_lm.server: 32), so a trace of 32 never
    # queues for a place (docs/benchmarks.md, "Admission by memory").
    max_sequences: int = 64
    prefill_step_size: int = 0  # 0: 128 on the CPU (~1.5 s a chunk here), 512 on a GPU
    prefill_batch_size: int = 8
    prefill_step_tokens: int = 0  # prompt tokens prefilled in one step, all new requests together; 0: by device
    prompt_cache_bytes: int = field(default_factory=_default_prompt_cache_bytes)
    prompt_cache_entries: int = 64
    prompt_cache_disk_bytes: Optional[int] = None  # disk tier (disk_tier.py); None: 4 GiB or less by free space, 0: off
    forward_chunk_tokens: int = 0  # 0: a causal LM's prefill chunk, 1024 for an encoder
    max_waiting: int = 128  # requests queued beyond the batch's free places; more are refused
    kv_budget_bytes: Optional[int] = None  # KV bytes running requests may reserve; None: from memory, 0: no bound
    health_timeout: float = 60.0  # seconds failing, or inside one pass, before Health says not serving

    @classmethod
    def from_settings(cls, s) -> "EngineConfig":
        """From load_options.Settings; a row left unset (None) keeps the engine's default."""
        d = cls()
        return cls(
            max_sequences=s.max_sequences, prefill_step_size=s.prefill_step_size,
            prefill_batch_size=s.prefill_batch_size, prefill_step_tokens=s.prefill_step_tokens,
            prompt_cache_bytes=d.prompt_cache_bytes if s.prompt_cache_bytes is None else s.prompt_cache_bytes,
            prompt_cache_entries=s.prompt_cache_entries, prompt_cache_disk_bytes=s.prompt_cache_disk_bytes,
            forward_chunk_tokens=s.forward_chunk_tokens or 0,
            max_waiting=s.max_waiting, kv_budget_bytes=s.kv_budget_bytes, health_timeout=s.health_timeout)
