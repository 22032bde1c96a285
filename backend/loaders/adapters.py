"""LoRA adapters applied at load: mlx-lm adapter directories, several at once.

An mlx-lm adapter directory holds `adapter_config.json` and
`adapters.safetensors`, whose tensors are named `<linear path>.lora_a`
(in x r) and `<linear path>.lora_b` (r x out); mlx-lm's LoRALinear adds
`scale * (x @ lora_a) @ lora_b` to the linear's output, `scale` from
`lora_parameters` in the config. mlx-lm applies one adapter by swapping in
LoRALinear layers; here several adapters, each with the host's scale, are
applied to the same linear:

- a float linear gets every adapter fused into its weight
  (W + sum of s * B^T A^T): exact up to rounding and free at decode time;
- a quantized linear keeps its weight as loaded (fusing would dequantize it,
  growing its memory, or requantize it, losing the adapter in the rounding)
  and adds each adapter's low-rank product to its output (LoRAStack).

Everything is checked before any weight changes, so a mismatched adapter
fails the load with a message and leaves nothing half applied. Loader thread.
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn

log = logging.getLogger("mlx-backend.lora")

CONFIG = "adapter_config.json"
WEIGHTS = "adapters.safetensors"


class AdapterError(Exception):
    """An adapter that cannot be applied to this model; the message says why."""


@dataclass
class LoRAPart:
    a: mx.array  # (in, r)
    b: mx.array  # (r, out)
    scale: float  # the adapter's own scale times the host's


class LoRAStack(nn.Module):
    """A quantized linear plus the low-rank products of its adapters."""

    def __init__(self, base: nn.Module, parts: List[LoRAPart]):
        super().__init__()
        self.base = base
        self.lora_a = [p.a for p in parts]
        self.lora_b = [p.b for p in parts]
        self.scales = [p.scale for p in parts]

    def __call__(self, x):
        y = self.base(x)
        for a, b, s in zip(self.lora_a, self.lora_b, self.scales):
            y = y + (s * ((x @ a) @ b)).astype(y.dtype)
        return y


def resolve(path: str, model_path: str) -> str:
    """An adapter directory: absolute as given, relative first under ModelPath (as the model is)."""
    path = os.path.expanduser(path)
    candidates = [path] if os.path.isabs(path) else (
        [os.path.join(model_path, path)] if model_path else []) + [path]
    for c in candidates:
        if os.path.isdir(c):
            return c
    raise AdapterError(f"LoRA adapter {path!r} not found (looked in: {', '.join(candidates)})")


def _read(directory: str) -> Tuple[float, Dict[str, mx.array]]:
    """The adapter's own scale and its tensors."""
    try:
        with open(os.path.join(directory, CONFIG)) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise AdapterError(f"LoRA adapter {directory}: no {CONFIG} (not an mlx-lm adapter directory)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"LoRA adapter {directory}: {CONFIG} unreadable: {e}") from None
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(f"LoRA adapter {directory}: fine_tune_type {kind!r} is not served (only 'lora')")
    params = config.get("lora_parameters") or {}
    if not isinstance(params.get("scale"), (int, float)):
        raise AdapterError(f"LoRA adapter {directory}: lora_parameters.scale missing from {CONFIG}")
    try:
        weights = mx.load(os.path.join(directory, WEIGHTS))
    except Exception as e:  # missing or damaged: the reader's own words
        raise AdapterError(f"LoRA adapter {directory}: cannot read {WEIGHTS}: {e}") from None
    return float(params["scale"]), weights


def _dims(linear) -> Tuple[int, int]:
    out_dims, in_dims = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        in_dims = in_dims * 32 // linear.bits
    return in_dims, out_dims


def _parts(model, directory: str, scale: float, modules: Dict[str, nn.Module]) -> Dict[str, LoRAPart]:
    """This adapter's low-rank pair for each linear it names, checked against the model."""
    own_scale, weights = _read(directory)
    if not weights:
        raise AdapterError(f"LoRA adapter {directory}: {WEIGHTS} holds no tensors")
    pairs: Dict[str, Dict[str, mx.array]] = {}
    errors = []
    for name, w in weights.items():
        path, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            errors.append(f"{name}: not a LoRA tensor (lora_a / lora_b)")
            continue
        pairs.setdefault(path, {})[leaf] = w
    parts = {}
    for path, pair in pairs.items():
        linear = modules.get(path)
        if not isinstance(linear, (nn.Linear, nn.QuantizedLinear)):
            errors.append(f"{path}: " + ("no such layer in the model" if linear is None
                                         else f"a {type(linear).__name__}, not a linear layer"))
            continue
        if set(pair) != {"lora_a", "lora_b"}:
            errors.append(f"{path}: has {', '.join(sorted(pair))} only")
            continue
        a, b = pair["lora_a"], pair["lora_b"]
        in_dims, out_dims = _dims(linear)
        if a.ndim != 2 or b.ndim != 2 or a.shape != (in_dims, b.shape[0]) or b.shape[1] != out_dims:
            errors.append(f"{path}: lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} do not fit "
                          f"a {in_dims} -> {out_dims} layer")
            continue
        parts[path] = LoRAPart(a, b, own_scale * scale)
    if errors:
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise AdapterError(f"LoRA adapter {directory} does not fit this model: {shown}")
    return parts


def apply(model, requests: Sequence[Tuple[str, float]], model_path: str = "", evaluate: bool = True) -> List[str]:
    """Apply each (adapter directory, scale) to `model`; the directories used. Without `evaluate`
    the fused weights stay lazy (a model about to be divided over ranks: each rank computes
    only its part, when the loader evaluates what it keeps)."""
    if not requests:
        return []
    modules = dict(model.named_modules())
    directories, stacks = [], {}
    for path, scale in requests:
        directory = resolve(path, model_path)
        for layer, part in _parts(model, directory, scale, modules).items():
            stacks.setdefault(layer, []).append(part)
        directories.append(directory)
    stacked = []
    for layer, parts in stacks.items():
        linear = modules[layer]
        if isinstance(linear, nn.QuantizedLinear):
            dtype = linear.scales.dtype
            stacked.append((layer, LoRAStack(linear, [
                LoRAPart(p.a.astype(dtype), p.b.astype(dtype), p.scale) for p in parts])))
        else:
            delta = sum((p.scale * p.b.T.astype(mx.float32)) @ p.a.T.astype(mx.float32) for p in parts)
            linear.weight = (linear.weight.astype(mx.float32) + delta).astype(linear.weight.dtype)
    if stacked:
        from mlx.utils import tree_unflatten

        model.update_modules(tree_unflatten(stacked))
    if evaluate:
        mx.eval(model.parameters())
    log.info("LoRA: %d adapter(s) on %d layers (%d fused, %d stacked on quantized layers)",
             len(directories), len(stacks), len(stacks) - len(stacked), len(stacked))
    return directories
