"""Admission by KV bytes: a request reserves its prompt plus its token budget before it runs.

A step that runs out of memory fails the whole batch (or the OOM killer takes
the process), so a request is admitted only while the reservations of the
running ones leave room for all of it; one that could never fit is refused at
once. The reservation is an upper bound: every position the request may reach.
"""

import logging
import os
from typing import Optional

log = logging.getLogger("mlx-backend.engine")


def need(prompt_tokens: int, max_tokens: int, bytes_per_token: int) -> int:
    """The KV bytes a request may use: every position it can reach."""
    return (prompt_tokens + max_tokens) * bytes_per_token


def _available_bytes(mx) -> Optional[int]:
    """Memory the KV cache may still take: the GPU's working set, else what the OS has available."""
    try:
        info = mx.device_info()
    except Exception:  # older MLX, or no device information
        info = {}
    total = info.get("max_recommended_working_set_size") or info.get("memory_size")
    if total:
        return max(int(total) - mx.get_active_memory(), 0)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget(mx) -> int:
    """Half the memory available once the model is loaded (0: unknown, no bound): the other
    half is left to the prefix cache, activations and the rest of the machine."""
    available = _available_bytes(mx)
    return available // 2 if available else 0


def refusal(prompt_tokens: int, max_tokens: int, bytes_per_token: int, budget: int) -> str:
    return (f"the request needs {need(prompt_tokens, max_tokens, bytes_per_token)} bytes of KV cache "
            f"(prompt {prompt_tokens} + max tokens {max_tokens} at {bytes_per_token} bytes/token), more than "
            f"the KV budget of {budget} bytes (option kv_budget_bytes): send fewer Tokens or a shorter prompt")
