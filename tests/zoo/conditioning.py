"""A random-weight model made to decode greedily with clear margins, depending on its prompt.

At the default init a tiny model's logits are flat (near-ties everywhere, so any float
reordering changes the text), its layers add little to the residual stream (each token's own
embedding wins and greedy repeats one token whatever the prompt), and its special tokens are
as likely as any (it stops early). `condition` fixes the three on the model in place.
"""

from dataclasses import dataclass

LOGIT_STD = 3.0  # top-1/top-2 margins are then mostly tenths, far above float batching noise (~1e-5)
SPECIAL_DAMP = 0.01
LAYER_GAIN = 3.0


class LibraryCannot(Exception):
    """The library itself cannot run the model here (NaN on the CPU, ...)."""


def fill_packed(model) -> None:
    """Random weights for quantized layers a family builds already packed (and zeroed: the
    Hadamard packs of prism_hadamard_qwen35), quantized as the layer stores them."""
    import mlx.core as mx

    for _, m in model.named_modules():
        if "scales" in m and m.weight.dtype == mx.uint32:
            shape = (m.weight.shape[0], m.scales.shape[-1] * m.group_size)
            w = mx.random.uniform(-1, 1, shape) / shape[1] ** 0.5
            m.weight, scales, biases = mx.quantize(w, group_size=m.group_size, bits=m.bits)
            m.scales, m.biases = scales.astype(m.scales.dtype), biases.astype(m.biases.dtype)


def spread(values) -> float:
    """The logits' standard deviation over the vocabulary, of the finite ones (phi3small sets
    its reserved ids to -inf); LibraryCannot on NaN."""
    import mlx.core as mx

    if mx.isnan(values).any().item():
        raise LibraryCannot("mlx-lm's forward pass gives NaN on the CPU")
    finite = mx.isfinite(values)
    n = finite.sum(axis=-1, keepdims=True)
    mean = mx.where(finite, values, 0).sum(axis=-1, keepdims=True) / n
    variance = mx.where(finite, (values - mean) ** 2, 0).sum(axis=-1) / n[..., 0]
    return mx.sqrt(variance).mean().item()


def logits(model, ids):
    """The model's float32 logits for one prompt of token ids, (tokens, vocab)."""
    import mlx.core as mx

    out = model(mx.array([ids]))
    out = (out[0] if isinstance(out, tuple) else out)[0].astype(mx.float32)
    mx.eval(out)
    return out


@dataclass
class _Head:
    """The array that turns the last hidden state into logits, one row per token."""
    owner: object  # the module holding it
    key: str  # its name there: "weight", or a bare array's own name (talkie's `lm_head`)
    path: str  # its name among the model's parameters
    tied: bool  # it is the input embedding too

    @property
    def weight(self):
        return self.owner[self.key]

    @weight.setter
    def weight(self, value):
        self.owner[self.key] = value


def _output_head(model, vocab: int) -> _Head:
    """An nn.Linear with one row per token, else a bare (vocab, hidden) array whose name says
    head, else the token embedding (a tied head)."""
    import mlx.core as mx
    import mlx.nn as nn

    def path(name, key):
        return f"{name}.{key}" if name else key

    modules = model.named_modules()
    for name, m in reversed(modules):
        if isinstance(m, nn.Linear) and m.weight.shape[0] == vocab:
            return _Head(m, "weight", path(name, "weight"), False)
    for name, m in modules:
        for key, v in m.items():
            if "head" in key and isinstance(v, mx.array) and v.ndim == 2 and v.shape[0] == vocab:
                return _Head(m, key, path(name, key), False)
    embeds = [(name, m) for name, m in modules if isinstance(m, nn.Embedding) and m.weight.shape[0] == vocab]
    if embeds:  # the widest: gemma3n's narrow per-layer embeddings have one row per token too
        name, m = max(embeds, key=lambda e: e[1].weight.shape[1])
        return _Head(m, "weight", path(name, "weight"), True)
    raise RuntimeError("no output head found (no Linear, head array or Embedding with one row per token)")


FINAL_NORMS = ("norm", "ln_f", "norm_f", "final_layernorm", "final_norm")


def _final_norm(model):
    """The norm applied to the last hidden state (a norm outside the layer list, by its usual
    names first), or None."""
    norms = [(n, m) for n, m in model.named_modules()
             if "norm" in type(m).__name__.lower() and "weight" in m and not any(p.isdigit() for p in n.split("."))]
    named = [m for n, m in norms if n.rsplit(".", 1)[-1] in FINAL_NORMS]
    return (named or [m for _, m in norms] or [None])[-1]


def condition(model, probe: list, specials: list, n_tokens: int, via_norm: bool = False) -> None:
    """Scale the head (or a tied head's final norm) to logits of std LOGIT_STD, shrink the rows
    of the special tokens and of ids past the tokenizer's `n_tokens` (a family whose code names
    token ids of its real vocabulary needs that vocabulary's size): a random model then decodes
    greedily with clear margins, and only to tokens the tokenizer has."""
    import mlx.core as mx

    vocab = logits(model, probe).shape[-1]
    head = _output_head(model, vocab)
    if not mx.any(head.weight).item():  # a head initialised to zeros (talkie's) gives flat logits
        head.weight = mx.random.normal(head.weight.shape) / head.weight.shape[1] ** 0.5
    _strengthen(model, head)
    norm = _final_norm(model) if head.tied or via_norm else None
    for _ in range(4):
        factor = LOGIT_STD / max(spread(logits(model, probe)[:, :n_tokens]), 1e-6)
        if abs(factor - 1) < 0.05:
            break
        if norm is not None and mx.abs(norm.weight).max().item() > 0:
            norm.weight = norm.weight * factor
        else:
            head.weight = head.weight * factor
        mx.eval(model.parameters())
    damped = mx.array([*specials, *range(n_tokens, head.weight.shape[0])])
    rows = mx.ones((head.weight.shape[0], 1)).at[damped].multiply(SPECIAL_DAMP)
    head.weight = (head.weight * rows).astype(head.weight.dtype)
    mx.eval(model.parameters())


def _strengthen(model, head) -> None:
    """Scale every matrix of the layers (not the embeddings, not the head) by LAYER_GAIN. At the
    default init the layers add little to the residual stream, each token's own embedding wins
    and greedy repeats one token whatever the prompt (a batch that mixed up its prompts would
    go unnoticed); stronger layers make the text depend on the whole prompt."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten

    kept = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding)} | {head.path}
    scaled = [(k, v * LAYER_GAIN) for k, v in tree_flatten(model.parameters())
              if v.ndim >= 2 and mx.issubdtype(v.dtype, mx.floating) and k not in kept]
    model.update(tree_unflatten(scaled))
    mx.eval(model.parameters())
