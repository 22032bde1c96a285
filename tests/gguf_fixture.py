"""A tiny llama GGUF (random weights, a small byte-level BPE vocabulary), written with gguf's own writer."""

import numpy as np

TOKENS = ["<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ġa", "ab", "."]
HIDDEN, FF, HEADS = 16, 32, 2


def write_tiny_gguf(path: str, seed: int = 0) -> str:
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(256)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    w.add_token_merges(["Ġ a", "a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", t(len(TOKENS), HIDDEN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                        ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FF, HIDDEN)), ("ffn_up", (FF, HIDDEN)),
                        ("ffn_down", (HIDDEN, FF))):
        w.add_tensor(f"blk.0.{name}.weight", t(*shape))
    for name in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(HIDDEN, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
