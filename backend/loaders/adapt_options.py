"""What LoadModel asks of LoRA adapters and of the KV cache, checked before loading.

Pure Python (no MLX): the servicer refuses a bad request here, before the
loader thread starts and while the old model keeps serving.
"""

import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from common.python_utils import OptionError

log = logging.getLogger("mlx-backend.options")

# The host spells cache types as llama.cpp does. mlx quantizes in groups with a
# float scale and bias each; llama.cpp's q4_0/q4_1 (and q5_0/q5_1) differ only in
# whether a block has a bias, so both map to the same bit width here.
_QUANTIZED = {"q8_0": 8, "q6_k": 6, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4}
_FLOAT = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16", "bf16": "bfloat16"}
_FLOAT_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}


@dataclass(frozen=True)
class KVSpec:
    """How the KV cache stores keys and values: `bits` > 0 quantized, else as `dtype`."""
    bits: int = 0
    group_size: int = 64
    dtype: str = ""  # a float storage type; "" keeps the model's own

    def describe(self) -> str:
        if self.bits:
            return f"{self.bits}-bit (group {self.group_size})"
        return self.dtype or "model dtype"

    def width(self) -> int:
        """Bits per stored element, to pick the more precise of two requests."""
        return self.bits or _FLOAT_BITS.get(self.dtype, 32)


def _cache_type(field: str, text: str) -> Optional[KVSpec]:
    name = text.strip().lower()
    if not name:
        return None
    if name in _QUANTIZED:
        return KVSpec(bits=_QUANTIZED[name])
    if name in _FLOAT:
        return KVSpec(dtype=_FLOAT[name])
    raise OptionError(f"{field}: unknown cache type {text!r} (one of: {', '.join([*_FLOAT, *_QUANTIZED])})")


def kv_spec(cache_type_key: str, cache_type_value: str, options) -> Optional[KVSpec]:
    """The KV cache asked for, or None for the model's own float cache.

    The Option `kv_bits` (with `kv_group_size`) wins over CacheTypeKey/Value.
    mlx's quantized attention reads keys and values with one bit width, so
    when the two types differ the more precise one serves both (logged).
    """
    group, bits = options.kv_group_size, options.kv_bits  # load_options checked them against the table
    if bits:
        return KVSpec(bits=bits, group_size=group)
    key = _cache_type("CacheTypeKey", cache_type_key)
    value = _cache_type("CacheTypeValue", cache_type_value)
    if key and value and key != value:
        wider = max(key, value, key=KVSpec.width)
        log.warning("CacheTypeKey %r and CacheTypeValue %r differ: both use %s", cache_type_key,
                    cache_type_value, wider.describe())
        key = wider
    spec = key or value
    if spec is None or spec.dtype == "float32":
        return None  # the model's own cache (float32 on the CPU path already)
    return KVSpec(bits=spec.bits, group_size=group, dtype=spec.dtype)


def lora_requests(adapter: str, scale: float, adapters: Sequence[str],
                  scales: Sequence[float]) -> List[Tuple[str, float]]:
    """(path, scale) for each adapter asked for, in order.

    `LoraAdapter` with `LoraScale` (0, unset in proto3, means 1), then each of
    `LoraAdapters` with its `LoraScales` entry (1 when the list is shorter).
    """
    if len(scales) > len(adapters):
        raise OptionError(f"LoraScales: {len(scales)} scales for {len(adapters)} LoraAdapters")
    out = []
    if adapter.strip():
        out.append((adapter.strip(), scale or 1.0))
    for i, path in enumerate(adapters):
        if not path.strip():
            raise OptionError(f"LoraAdapters[{i}]: empty path")
        out.append((path.strip(), scales[i] if i < len(scales) else 1.0))
    for path, s in out:
        if s != s or s in (float("inf"), float("-inf")):
            raise OptionError(f"LoRA scale for {path!r}: must be a finite number, got {s}")
    return out
