"""One GGUF file into a plain mlx-lm model directory (the conversion itself).

config.json from the GGUF metadata, safetensors with Hugging Face tensor
names (kept quantized where MLX reads the type natively, dequantized
otherwise), and tokenizer.json plus tokenizer_config.json rebuilt from the
GGUF vocabulary. gguf_loader decides when to convert and keeps the result.
"""

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

log = logging.getLogger("mlx-backend.gguf")

# Bump when the conversion changes, so old cache entries are not reused.
CONVERTER_VERSION = 1

# Types MLX's own GGUF reader keeps quantized (as affine triples).
NATIVE_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}

ARCHITECTURES = ("llama", "qwen2")
PROGRESS_EVERY_S = 5.0  # a long conversion says how far it got this often

# Pre-tokenizer split patterns by `tokenizer.ggml.pre` (facts from the models'
# own tokenizer definitions).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFError(ValueError):
    """A GGUF file this loader cannot serve; the message says why."""


def hf_name(name: str) -> str:
    """llama.cpp tensor name -> mlx-lm (Hugging Face) name, suffix kept."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias|scales|biases)", name)
    if m:
        layer, part, suffix = m.groups()
        if part not in _LAYER_NAMES:
            raise GGUFError(f"unsupported tensor {name!r}")
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"
    base, _, suffix = name.rpartition(".")
    if base not in _TOP_NAMES:
        raise GGUFError(f"unsupported tensor {name!r}")
    return f"{_TOP_NAMES[base]}.{suffix}"


def read_metadata(path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(metadata key -> python value, tensor name -> GGML type name)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = fld.contents()
        meta[key] = value
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    return meta, types


def model_config(meta: Dict[str, Any], tensor_names) -> Dict[str, Any]:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    head_dim = get("attention.key_length")
    if head_dim and int(head_dim) != hidden // n_heads:
        config["head_dim"] = int(head_dim)
    if arch == "llama":
        # llama.cpp's converter permutes Q and K rows for its interleaved rope;
        # traditional rope on the permuted rows gives the same attention.
        config["rope_traditional"] = True
    scaling = get("rope.scaling.type")
    if scaling == "linear" and get("rope.scaling.factor"):
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        if key in meta:
            config.setdefault("eos_token_id", [])
            if int(meta[key]) not in config["eos_token_id"]:
                config["eos_token_id"].append(int(meta[key]))
    return config


def build_tokenizer(meta: Dict[str, Any], out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json from the GGUF vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens: List[str] = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))

    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre in ("qwen2", "deepseek-r1-qwen"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"), byte_level])
    elif pre in ("llama-bpe", "llama3", "smaug-bpe"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"), byte_level])
    else:
        if pre not in ("gpt2", "default"):
            log.warning("GGUF pre-tokenizer %r unknown; using GPT-2 byte-level splitting", pre)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()

    # Control tokens (3) are special; user-defined ones (4) such as
    # <tool_call> match as units but decode as text.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == 4])

    def token(key):
        idx = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(idx)] if idx is not None and int(idx) < len(tokens) else None

    bos, eos = token("bos"), token("eos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        bos_id = vocab[bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])

    kwargs = {"tokenizer_object": tok, "clean_up_tokenization_spaces": False}
    for name in ("bos", "eos", "unk"):
        if token(name) is not None:
            kwargs[f"{name}_token"] = token(name)
    kwargs["pad_token"] = token("padding") or eos
    fast = PreTrainedTokenizerFast(**kwargs)
    if meta.get("tokenizer.chat_template"):
        fast.chat_template = meta["tokenizer.chat_template"]
    fast.save_pretrained(str(out_dir))


def _native_weights(path: str) -> Dict[str, Any]:
    import mlx.core as mx

    weights = mx.load(path)
    return {hf_name(k): v for k, v in weights.items()}


def _dequantized_weights(path: str) -> Dict[str, Any]:
    import mlx.core as mx
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    out = {}
    total, last_log = len(reader.tensors), time.monotonic()
    for i, t in enumerate(reader.tensors):
        if time.monotonic() - last_log >= PROGRESS_EVERY_S:
            last_log = time.monotonic()
            log.info("dequantizing %s: %d/%d tensors", os.path.basename(path), i, total)
        arr = dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = arr.reshape(shape)
        # float16 keeps what <= 8-bit quants hold; norms stay float32.
        dtype = np.float32 if arr.ndim == 1 else np.float16
        out[hf_name(t.name)] = mx.array(arr.astype(dtype, copy=False))
    return out


def convert(path: str, out_dir: Path) -> None:
    import mlx.core as mx

    meta, types = read_metadata(path)
    config = model_config(meta, types.keys())
    native = set(types.values()) <= NATIVE_TYPES
    quantized = native and any(t.startswith("Q") for t in types.values())
    weights = _native_weights(path) if native else _dequantized_weights(path)
    if quantized:
        # Per-layer bits are inferred from the shapes by mlx-lm's loader.
        config["quantization"] = {"group_size": 32, "bits": 4}
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(meta, out_dir)
    (out_dir / "gguf_source.json").write_text(json.dumps(
        {"source": path, "tensor_types": sorted(set(types.values())), "native": native}))
