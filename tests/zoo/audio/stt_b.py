"""Tiny random-weight models of mlx-audio's speech-to-text families that decode with a language
model: an audio encoder (or audio tokenizer) whose frames are spliced into a decoder's prompt,
plus Qwen3's forced aligner (the same towers, a classifier head) and Voxtral Realtime (one token
per 80 ms of audio).

Each recipe writes a folder in its family's own layout: config.json with the model_type
mlx-audio's loader resolves, seeded random weights of the family's own classes saved in the key
layout its `sanitize` passes through unchanged, and every file its processor reads (a byte-level
BPE of a few hundred tokens trained here, a chat template, a feature extractor's config, a
tekken.json, an audio tokenizer's sub-folder). Towers are 32 wide with one or two layers, but
where a family's code fixes a size (MiMo's prompt writes token ids past 111000, Voxtral
Realtime's adapter writes its 3072-wide output), measured in that recipe's docstring.

The weights are shaped so that greedy decoding is a stable function of the audio: the decoder's
attention and MLP outputs outweigh its residual and the audio frames outweigh the prompt's text
(SHAPING, with a family's own factors where its names differ), the output head is scaled so the
logits have a standard deviation near 3 (the top-1/top-2 margins seen over the matrix's clips are
0.013 and more, far above float32 reordering noise), and the rows of the tokens greedy should
not pick (specials, end of sequence included, and tokens that are not printable ASCII on their
own) are shrunk, so decoding neither stops at its first step nor emits markup or broken bytes.
"""

import json
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from zoo.audio.recipe import AudioRecipe

LOGIT_STD = 3.0  # greedy margins are then mostly tenths
DAMP = 0.01  # what the rows of quiet tokens (_quiet_ids) keep in the output head
CLIPS = ((1, 2.0), (2, 2.0))
# Words a transcript is made of: the tokenizer's merges come from them, so what the tiny models
# say reads as fragments of words rather than single bytes.
CORPUS = [
    "the quick brown fox jumps over the lazy dog while the sun is shining",
    "hello world how are you today i am fine thank you and you",
    "one two three four five six seven eight nine ten eleven twelve",
    "speech recognition turns spoken words into written text for everyone",
    "she sells sea shells by the sea shore and the shells are blue",
    "good morning good evening good night see you later my friend",
    "please write down what you hear in the audio and nothing else",
    "the weather is nice today so we will walk to the river and back",
]


# --- shared pieces ---------------------------------------------------------------------------

def _train_bpe(folder: Path, specials: List[str], vocab: int = 384, chat_template: Optional[str] = None,
               **named):
    """A byte-level BPE trained on CORPUS with `specials` at its first ids, saved into `folder`;
    `named`: the tokenizer's named tokens (eos_token=..., pad_token=...). Returns the transformers
    tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    named_values = set(named.values())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **named,
                                   additional_special_tokens=[s for s in specials if s not in named_values])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return fast


def _module(family: str):
    import importlib

    return importlib.import_module(f"mlx_audio.stt.models.{family}")


def _new_model(family: str, config: dict):
    """The family's model for `config`, made as mlx-audio's loader makes it."""
    module = _module(family)
    cfg = dict(config)
    model_config = module.ModelConfig.from_dict(cfg) if hasattr(module, "ModelConfig") else cfg
    return module.Model(model_config)


# Parameters a module computes rather than learns (sinusoid tables, rotary frequencies): saved as
# the module made them, neither replaced nor scaled.
COMPUTED = ("positional_embedding", "inv_freq")


def _random_weights(model, scale: float = 1.0, scaled: Optional[Dict[str, float]] = None,
                    gains: Optional[Dict[str, float]] = None) -> Dict[str, object]:
    """The model's seeded parameters: each matrix the library starts at a constant given random
    values of the usual scale (left constant, an input would not reach the output); every matrix
    multiplied by the factor of the first part of `scaled` its name contains, else by `scale`;
    every vector whose name contains a part of `gains` (a norm's gain) multiplied by its factor."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    scaled, gains = scaled or {}, gains or {}
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if any(part in name for part in COMPUTED):
            out[name] = w
            continue
        if w.ndim >= 2 and w.size > 1 and float(mx.std(w.astype(mx.float32)).item()) == 0.0:
            w = (mx.random.normal(w.shape) * w.shape[-1] ** -0.5).astype(w.dtype)
        if w.ndim >= 2:
            w = w * next((f for part, f in scaled.items() if part in name), scale)
        else:
            w = w * next((f for part, f in gains.items() if part in name), 1.0)
        out[name] = w
    return out


# How the decoder families' weights are shaped so that what they say depends on the audio and
# does not fall into repeating one token: the attention and MLP outputs outweigh the residual
# (with a head tied to the input embedding, a token whose embedding dominates the residual
# predicts itself again), the audio tower's frames outweigh the prompt's text, and the attention
# is sharp enough that successive positions read different frames.
DECODER_SCALE = 2.0
DECODER_SCALED = {"embed_tokens": 0.5, "o_proj": 6.0, "down_proj": 6.0, "audio_tower": 3.0, "q_proj": 6.0,
                  "k_proj": 6.0}
DECODER_GAINS = {"q_norm": 3.0, "k_norm": 3.0}
SHAPING = {"scale": DECODER_SCALE, "scaled": DECODER_SCALED, "gains": DECODER_GAINS}


def _shaped(model, shaping: Optional[dict]) -> Dict[str, object]:
    """_random_weights of `model` under `shaping` (SHAPING's keys; a recipe's own or the default)."""
    shaping = {**SHAPING, **(shaping or {})}
    return _random_weights(model, shaping["scale"], shaping["scaled"], shaping["gains"])


def _condition_head(model, weights: Dict[str, object], head: str, quiet: Iterable[int],
                    logits_of: Callable[[object], object], gain: Optional[str] = None) -> None:
    """Scale `head` (or, for a head tied to the input embedding, the `gain` vector in front of it)
    so the logits `logits_of(model)` has a standard deviation of LOGIT_STD, and shrink the rows
    of the `quiet` token ids in `head`, in place."""
    import mlx.core as mx

    model.load_weights(list(weights.items()), strict=False)
    std = float(mx.std(logits_of(model).astype(mx.float32)).item())
    target = gain or head
    weights[target] = weights[target] * (LOGIT_STD / std)
    quiet = sorted(set(quiet))
    if quiet:
        rows = mx.zeros((weights[head].shape[0], 1), dtype=mx.bool_)
        rows[mx.array(quiet)] = True
        weights[head] = mx.where(rows, weights[head] * DAMP, weights[head])
    model.load_weights(list(weights.items()), strict=False)


def _save(folder: Path, config: dict, weights: Dict[str, object], name: str = "model.safetensors") -> None:
    import mlx.core as mx

    (folder / "config.json").write_text(json.dumps(config, indent=1))
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(folder / name), weights, metadata={"format": "mlx"})


def _torch_conv1d(weights: Dict[str, object], part: str) -> Dict[str, object]:
    """`weights` with the 1-D convolution kernels under `part` in PyTorch's (out, in, width)
    order, the layout a checkpoint has and a family's sanitize turns into MLX's (out, width, in)."""
    return {k: v.transpose(0, 2, 1) if part in k and k.endswith("weight") and v.ndim == 3 else v
            for k, v in weights.items()}


def _whisper_features(folder: Path, mel_bins: int, **kw) -> None:
    """A Whisper feature extractor's preprocessor_config.json (the log-mel front end several of
    these families share)."""
    from transformers import WhisperFeatureExtractor

    WhisperFeatureExtractor(feature_size=mel_bins, **kw).save_pretrained(str(folder))


def _quiet_ids(tok) -> List[int]:
    """Ids greedy decoding should not pick: the special tokens, and every token that does not
    decode on its own to printable ASCII (a lone byte of a multi-byte character decodes to
    U+FFFD; control characters would make unreadable transcripts)."""
    quiet = set(tok.all_special_ids)
    for i in range(len(tok)):
        text = tok.decode([i])
        if not text or any(not (32 <= ord(c) < 127) for c in text):
            quiet.add(i)
    return sorted(quiet)


def _ids(tok, tokens: Iterable[str]) -> Dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in tokens}


def _probe_ids(tok):
    import mlx.core as mx

    return mx.array([tok.encode(CORPUS[0] + " " + CORPUS[3])])


# --- Qwen3-ASR and Qwen3-ForcedAligner -------------------------------------------------------

_QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                   "<|audio_pad|>", "<asr_text>", "<timestamp>"]


def _qwen3_config(tok, model_type: str) -> dict:
    """A Qwen3-ASR config in the checkpoint's layout (the towers under thinker_config): a 1-layer
    audio encoder of width 32 behind 8-channel convolutions, a 2-layer Qwen3 decoder of width 32."""
    ids = _ids(tok, ["<|audio_pad|>", "<|audio_start|>", "<|audio_end|>", "<timestamp>"])
    thinker = {
        "model_type": model_type,
        "audio_config": {"num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2,
                         "encoder_ffn_dim": 64, "d_model": 32, "output_dim": 32,
                         "downsample_hidden_size": 8, "max_source_positions": 1500, "n_window": 50,
                         "n_window_infer": 800},
        "text_config": {"model_type": "qwen3", "vocab_size": len(tok), "hidden_size": 32,
                        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": True,
                        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
        "audio_token_id": ids["<|audio_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],
    }
    config = {"model_type": "qwen3_asr", "thinker_config": thinker,
              "support_languages": ["English", "Chinese", "French"]}
    if model_type == "qwen3_forced_aligner":
        # The aligner's head classifies each <timestamp> slot into a time of class * 80 ms: 40
        # classes reach 3.2 s, past the matrix's 2-second clips (the checkpoint's 5000, 400 s).
        config["model_type"] = model_type
        thinker["classify_num"] = 40
        config["timestamp_token_id"] = ids["<timestamp>"]
        config["timestamp_segment_time"] = 80.0
    return config


def build_qwen3_asr(folder: Path, shaping: Optional[dict] = None) -> None:
    """Qwen3-ASR: Whisper log-mels (128 bins) through Conv2d downsampling and an encoder whose
    frames replace the <|audio_pad|> run of a ChatML prompt; the decoder's head is its tied
    embedding (sanitize drops any lm_head), so the final norm carries the logits' scale and the
    quiet tokens' embedding rows are the ones shrunk."""
    tok = _train_bpe(folder, _QWEN3_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    _whisper_features(folder, 128)
    config = _qwen3_config(tok, "qwen3_asr")
    model = _new_model("qwen3_asr", config)
    weights = _shaped(model, shaping)

    def logits_of(m):
        hidden = m.model(input_ids=_probe_ids(tok))
        return m.model.embed_tokens.as_linear(hidden)

    _condition_head(model, weights, "model.embed_tokens.weight", _quiet_ids(tok), logits_of,
                    gain="model.norm.weight")
    _save(folder, config, weights)


def _aligner_slots(model, tok, timestamp_id: int):
    """A prompt the aligner reads (26 audio placeholders, a sentence of CORPUS between
    <timestamp> slots) and the positions of its slots."""
    import mlx.core as mx
    import numpy as np

    _, text = model.aligner_processor.encode_timestamp(CORPUS[0], "English")
    ids = mx.array([tok.encode(text.replace("<|audio_pad|>", "<|audio_pad|>" * 26), add_special_tokens=False)])
    return ids, mx.array(np.where(np.array(ids[0]) == timestamp_id)[0])


def build_qwen3_forced_aligner(folder: Path, shaping: Optional[dict] = None) -> None:
    """Qwen3-ForcedAligner: Qwen3-ASR's towers with a classifier head instead of the vocabulary
    (kept by its sanitize, unlike Qwen3-ASR's), run once over <|audio_pad|> frames followed by
    the words to align, each word between <timestamp> slots; argmax over a slot's classes is its
    time (class x 80 ms), repaired by the processor into a non-decreasing sequence."""
    import mlx.core as mx

    tok = _train_bpe(folder, _QWEN3_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    _whisper_features(folder, 128)
    config = _qwen3_config(tok, "qwen3_forced_aligner")
    model = _new_model("qwen3_forced_aligner", config)
    weights = _shaped(model, shaping)
    # The head is shaped where it is read, at the slots. Their states share one direction (the
    # same token at each): left in, one class wins every slot and the repaired times collapse to
    # one, so the head is made blind to it and reads what differs between slots.
    ids, slots = _aligner_slots(model, tok, config["timestamp_token_id"])
    model.load_weights(list(weights.items()), strict=False)
    shared = mx.mean(model.model(inputs_embeds=model.model.embed_tokens(ids))[0][slots], axis=0)
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = head - (head @ shared)[:, None] * shared[None, :] / mx.sum(shared * shared)
    _condition_head(model, weights, "lm_head.weight", [], lambda m: m(ids)[0][slots])
    _save(folder, config, weights)


# --- Qwen2-Audio ------------------------------------------------------------------------------

_CHATML = ("{% for message in messages %}"
           "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
           "{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def build_qwen2_audio(folder: Path, shaping: Optional[dict] = None) -> None:
    """Qwen2-Audio: the model computes its own log-mels (audio padded or cut to
    2 * max_source_positions hops: 30 s at the checkpoint's 1500, kept here), a Whisper-style
    encoder average-pooled to 750 frames, a Qwen2 decoder with its own lm_head. Only the
    processor's tokenizer and chat template are read (transformers' Qwen2AudioProcessor, which
    AutoProcessor resolves from the saved processor_config.json)."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
    tok = _train_bpe(folder, specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok,
                                    chat_template=_CHATML)
    processor.save_pretrained(str(folder))
    config = {
        "model_type": "qwen2_audio",
        "audio_token_id": tok.convert_tokens_to_ids("<|AUDIO|>"),
        "audio_config": {"model_type": "qwen2_audio_encoder", "d_model": 32, "encoder_layers": 1,
                         "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 128,
                         "max_source_positions": 1500},
        "text_config": {"model_type": "qwen2", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False},
    }
    model = _new_model("qwen2_audio", config)
    weights = _shaped(model, shaping)
    _condition_head(model, weights, "language_model.lm_head.weight", _quiet_ids(tok),
                    lambda m: m(_probe_ids(tok)))
    # sanitize transposes every 3-D audio_tower kernel unless the file is quantized
    _save(folder, config, _torch_conv1d(weights, "audio_tower"))


# --- GLM-ASR ---------------------------------------------------------------------------------

def build_glmasr(folder: Path, shaping: Optional[dict] = None) -> None:
    """GLM-ASR: log-mels computed by the model, a Whisper encoder with rotary positions, frames
    merged 4 by 4 through an MLP adapter into a Llama decoder's prompt
    (<|user|>\\n<|begin_of_audio|> ... <|end_of_audio|>\\n...<|assistant|>\\n); the tokenizer is
    read with AutoTokenizer, the ends of sequence from lm_config.eos_token_id."""
    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_audio|>",
                "<|end_of_audio|>"]
    tok = _train_bpe(folder, specials, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    ends = [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    config = {
        "model_type": "glmasr",
        "whisper_config": {"model_type": "whisper", "d_model": 32, "encoder_attention_heads": 2,
                           "encoder_ffn_dim": 64, "encoder_layers": 1, "num_mel_bins": 128,
                           "max_source_positions": 1500},
        "lm_config": {"model_type": "llama", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                      "rope_theta": 10000.0, "tie_word_embeddings": False, "pad_token_id": ends[0],
                      "eos_token_id": ends},
        "merge_factor": 4, "use_rope": True, "max_whisper_length": 1500,
    }
    model = _new_model("glmasr", json.loads(json.dumps(config)))  # from_dict pops the nested configs
    weights = _shaped(model, shaping or {"scaled": {"audio_encoder": 3.0, **DECODER_SCALED}})
    _condition_head(model, weights, "language_model.lm_head.weight", _quiet_ids(tok),
                    lambda m: m.language_model(_probe_ids(tok)))
    _save(folder, config, weights)


# --- Granite Speech ---------------------------------------------------------------------------

_GRANITE_TEMPLATE = ("{% for message in messages %}"
                     "{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content']"
                     " + '<|end_of_text|>\\n' }}"
                     "{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}")


def build_granite_speech(folder: Path, shaping: Optional[dict] = None) -> None:
    """Granite Speech 4.x: 80 log-mels stacked in pairs (the encoder's input width, 160, is
    fixed by that code) through a Conformer CTC encoder (blocks of 200 frames), a Q-Former
    projector that reads each window of 15 frames with 3 queries, and a Granite decoder (its
    embedding, residual, attention and logits multipliers); the prompt is the tokenizer's chat
    template around <|audio|> placeholders."""
    specials = ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|audio|>", "<|pad|>"]
    tok = _train_bpe(folder, specials, chat_template=_GRANITE_TEMPLATE, eos_token="<|end_of_text|>",
                     pad_token="<|pad|>")
    config = {
        "model_type": "granite_speech",
        "audio_token_index": tok.convert_tokens_to_ids("<|audio|>"),
        "downsample_rate": 5, "window_size": 15, "has_lora_adapter": False,
        "encoder_config": {"model_type": "granite_speech_encoder", "input_dim": 160, "num_layers": 2,
                           "hidden_dim": 32, "feedforward_mult": 2, "num_heads": 2, "dim_head": 16,
                           "output_dim": 42, "context_size": 200, "max_pos_emb": 512, "conv_kernel_size": 15,
                           "conv_expansion_factor": 2},
        "projector_config": {"model_type": "blip_2_qformer", "hidden_size": 32, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "intermediate_size": 64, "encoder_hidden_size": 32,
                             "layer_norm_eps": 1e-12},
        "text_config": {"model_type": "granite", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                        "attention_bias": False, "mlp_bias": False, "attention_multiplier": 1 / 16,
                        "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 8.0,
                        "tie_word_embeddings": False},
    }
    model = _new_model("granite_speech", config)
    weights = _shaped(model, shaping)
    _condition_head(model, weights, "language_model.lm_head.weight", _quiet_ids(tok),
                    lambda m: m(_probe_ids(tok)))
    _save(folder, config, weights)


# --- Fun-ASR-Nano ----------------------------------------------------------------------------

def build_fun_asr_nano(folder: Path, shaping: Optional[dict] = None) -> None:
    """Fun-ASR-Nano: Kaldi fbank (80 mels) stacked 7 frames every 6 (560 inputs), a SenseVoice
    SANM encoder, a transformer adaptor and a Qwen3 decoder whose head is its embedding; the
    prompt is ChatML written in code, the tokenizer read from the sub-folder config.json names
    (qwen_tokenizer_path), the ends of sequence the Qwen ids 151643/151645 fixed in code, which a
    vocabulary of a few hundred never reaches: decoding runs to max_tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _train_bpe(folder / "Qwen3-0.6B", specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = {
        "model_type": "fun_asr_nano", "input_size": 560, "qwen_tokenizer_path": "Qwen3-0.6B",
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6},
        "audio_encoder_conf": {"output_size": 32, "attention_heads": 2, "linear_units": 64, "num_blocks": 1,
                               "tp_blocks": 1, "normalize_before": True, "kernel_size": 11, "sanm_shift": 0},
        "audio_adaptor_conf": {"downsample_rate": 1, "use_low_frame_rate": True, "ffn_dim": 64, "llm_dim": 32,
                               "encoder_dim": 32, "n_layer": 1, "attention_heads": 2},
        "text_config": {"model_type": "qwen3", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                        "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    }
    model = _new_model("fun_asr_nano", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "audio_adaptor": 2.0}})

    def logits_of(m):
        return m(_probe_ids(tok))

    _condition_head(model, weights, "llm.model.embed_tokens.weight", _quiet_ids(tok), logits_of,
                    gain="llm.model.norm.weight")
    _save(folder, config, weights)


# --- Higgs Audio 3 ----------------------------------------------------------------------------

def build_higgs_audio_3(folder: Path, shaping: Optional[dict] = None) -> None:
    """Higgs Audio 3 (ASR): log-mels computed by the model in chunks of chunk_size_seconds, a
    Whisper-style encoder average-pooled by 2, a strided depthwise convolution and an MLP (its
    2048-wide middle fixed in code) into a Qwen3 decoder with its own lm_head; the ends of
    sequence are the Qwen ids 151643/151645 fixed in code (never reached here: decoding runs to
    max_tokens). vad_cut is off: on, the model loads Silero VAD from the hub
    (mlx-community/silero-vad) and falls back to fixed chunks when it cannot."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO_IN|>",
                "<|AUDIO_OUT|>"]
    tok = _train_bpe(folder, specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = _ids(tok, specials)
    config = {
        "model_type": "higgs_audio_3",
        "audio_encoder_config": {"model_type": "higgs_audio_encoder", "num_mel_bins": 128, "encoder_layers": 1,
                                 "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32,
                                 "max_source_positions": 1500},
        "text_config": {"model_type": "qwen3", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                        "tie_word_embeddings": False},
        "projector_temporal_downsample": 2,
        "audio_in_token_idx": ids["<|AUDIO_IN|>"], "audio_out_token_idx": ids["<|AUDIO_OUT|>"],
        "audio_bos_token_id": ids["<|audio_bos|>"], "audio_eos_token_id": ids["<|audio_eos|>"],
        "pad_token_id": ids["<|endoftext|>"], "chunk_size_seconds": 4.0, "sample_rate": 16000,
        "vad_cut": False, "split_vads": False,
    }
    model = _new_model("higgs_audio_3", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "audio_tower": 4.0}})
    _condition_head(model, weights, "lm_head.weight", _quiet_ids(tok), lambda m: m(_probe_ids(tok)))
    # sanitize turns 3-D encoder and projector kernels from PyTorch's layout unless quantized
    weights = _torch_conv1d(_torch_conv1d(weights, "audio_tower.conv"), "audio_encoder_proj.temporal")
    _save(folder, config, weights)


# --- MOSS-Transcribe-Diarize --------------------------------------------------------------------

# Renders a user turn's audio part as the span the model splits its audio run into.
_MOSS_TEMPLATE = ("{% for message in messages %}"
                  "{{ '<|im_start|>' + message['role'] + '\\n' }}"
                  "{% if message['content'] is string %}{{ message['content'] }}"
                  "{% else %}{% for part in message['content'] %}"
                  "{% if part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>\\n' }}"
                  "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
                  "{% endfor %}{% endif %}"
                  "{{ '<|im_end|>\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def build_moss_transcribe_diarize(folder: Path, shaping: Optional[dict] = None) -> None:
    """MOSS-Transcribe-Diarize: Whisper features (80 mels, each 30-second chunk padded as the
    feature extractor's n_samples says), a Whisper encoder, frames merged 4 by 4 through an
    adaptor into a Qwen3 decoder whose head is its embedding; the prompt is the tokenizer's chat
    template, with the time markers of the audio run written in the tokenizer's digits (each
    must be one token)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"]
    tok = _train_bpe(folder, specials, chat_template=_MOSS_TEMPLATE, eos_token="<|im_end|>",
                     pad_token="<|endoftext|>")
    _whisper_features(folder, 80)
    config = {
        "model_type": "moss_transcribe_diarize",
        "audio_token_id": tok.convert_tokens_to_ids("<|audio_pad|>"), "audio_merge_size": 4,
        "tie_word_embeddings": True, "sample_rate": 16000,
        "audio_config": {"model_type": "whisper", "num_mel_bins": 80, "d_model": 32, "encoder_layers": 1,
                         "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "max_source_positions": 1500},
        "text_config": {"model_type": "qwen3", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True},
    }
    model = _new_model("moss_transcribe_diarize", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "whisper_encoder": 3.0, "vq_adaptor": 3.0}})
    _condition_head(model, weights, "model.language_model.embed_tokens.weight", _quiet_ids(tok),
                    lambda m: m(_probe_ids(tok)), gain="model.language_model.norm.weight")
    _save(folder, config, weights)


# --- VibeVoice-ASR ----------------------------------------------------------------------------

def _vibevoice_tokenizer_config(vae_dim: int, kind: str) -> dict:
    """One of VibeVoice's two convolutional speech tokenizers (acoustic, semantic): the
    checkpoint's strides (3200 samples a frame at 24 kHz), one block a stage, 1 base filter."""
    return {"model_type": f"vibevoice_{kind}_tokenizer", "vae_dim": vae_dim, "encoder_n_filters": 1,
            "encoder_ratios": [8, 5, 5, 4, 2, 2], "encoder_depths": "1-1-1-1-1-1-1", "causal": True,
            "mixer_layer": "depthwise_conv", "layernorm": "RMSNorm", "disable_last_norm": True}


def build_vibevoice_asr(folder: Path, shaping: Optional[dict] = None) -> None:
    """VibeVoice-ASR: the waveform at 24 kHz, loudness-normalized, through an acoustic and a
    semantic convolutional tokenizer (one frame per 3200 samples), each projected by a connector
    and summed into the <|box_start|> run of a Qwen2 prompt the code writes; the tokenizer must
    hold Qwen2.5's <|object_ref_start|>/<|object_ref_end|>/<|box_start|> (without them the model
    loads Qwen/Qwen2.5-7B's from the hub)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>"]
    tok = _train_bpe(folder, specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = {
        "model_type": "vibevoice",
        "acoustic_tokenizer_config": _vibevoice_tokenizer_config(16, "acoustic"),
        "semantic_tokenizer_config": _vibevoice_tokenizer_config(16, "semantic"),
        "decoder_config": {"model_type": "qwen2", "vocab_size": len(tok), "hidden_size": 32, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
                           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 8192,
                           "tie_word_embeddings": False},
        "acoustic_vae_dim": 16, "semantic_vae_dim": 16, "sample_rate": 24000, "speech_tok_compress_ratio": 3200,
    }
    model = _new_model("vibevoice_asr", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "connector": 3.0}})
    _condition_head(model, weights, "language_model.lm_head.weight", _quiet_ids(tok),
                    lambda m: m.language_model(_probe_ids(tok)))
    _save(folder, config, weights)


# --- Voxtral Realtime ---------------------------------------------------------------------------

_TEKKEN_SPECIALS = 40  # ids below are control tokens (<s> 1, </s> 2, [STREAMING_PAD] 32), decoded to nothing
# The audio adapter's output width is written in its code (3072, Voxtral Mini's decoder width), so
# the decoder is that wide and the adapter's second matrix is 3072 x 3072: those matrices are
# stored in float16, as checkpoints store theirs in half precision, to halve the folder.
_VOXTRAL_RT_DIM = 3072


def _write_tekken(folder: Path, tok) -> int:
    """tekken.json, the file Voxtral Realtime's own decoder reads: control tokens, then one
    entry per printable token of the trained BPE, its bytes in base64. Returns the size of
    the vocabulary."""
    import base64

    vocab = []
    for i in range(len(tok)):
        text = tok.decode([i])
        if i in tok.all_special_ids or not text or any(not (32 <= ord(c) < 127) for c in text):
            continue
        if any(entry["token_str"] == text for entry in vocab):
            continue
        vocab.append({"rank": len(vocab), "token_bytes": base64.b64encode(text.encode()).decode(),
                      "token_str": text})
    names = {0: "<unk>", 1: "<s>", 2: "</s>", 32: "[STREAMING_PAD]"}
    specials = [{"rank": i, "token_str": names.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                for i in range(_TEKKEN_SPECIALS)]
    data = {"config": {"pattern": "", "num_vocab_tokens": len(vocab) + _TEKKEN_SPECIALS,
                       "default_vocab_size": len(vocab) + _TEKKEN_SPECIALS,
                       "default_num_special_tokens": _TEKKEN_SPECIALS, "version": "v7"},
            "vocab": vocab, "special_tokens": specials}
    (folder / "tekken.json").write_text(json.dumps(data))
    return len(vocab) + _TEKKEN_SPECIALS


def build_voxtral_realtime(folder: Path, shaping: Optional[dict] = None) -> None:
    """Voxtral Realtime: 128 log-mels of the audio padded for offline streaming (32 silent tokens
    left, the transcription delay and 10 more right), a causal conv stem and sliding-window
    encoder, frames stacked 4 by 4 and projected to the decoder's width; the decoder emits one
    token per 80 ms of audio, its input the audio frame plus its own last token, its head the
    tied embedding. The tokenizer is tekken.json, read by the model's own decoder (no
    mistral-common)."""
    import tempfile

    import mlx.core as mx

    with tempfile.TemporaryDirectory() as scratch:
        vocab = _write_tekken(folder, _train_bpe(Path(scratch), ["<|endoftext|>"], eos_token="<|endoftext|>"))
    config = {
        "model_type": "voxtral_realtime", "transcription_delay_ms": 480, "n_left_pad_tokens": 32,
        "bos_token_id": 1, "eos_token_id": 2, "streaming_pad_token_id": 32,
        "encoder_args": {"dim": 32, "n_layers": 1, "n_heads": 2, "head_dim": 16, "hidden_dim": 64, "n_kv_heads": 2,
                         "norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": 750, "causal": True,
                         "use_biases": True, "downsample_factor": 4,
                         "audio_encoding_args": {"sampling_rate": 16000, "frame_rate": 12.5, "num_mel_bins": 128,
                                                 "hop_length": 160, "window_size": 400,
                                                 "global_log_mel_max": 1.5}},
        "decoder": {"dim": _VOXTRAL_RT_DIM, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16,
                    "hidden_dim": 32, "vocab_size": vocab, "norm_eps": 1e-5, "rope_theta": 1000000.0,
                    "sliding_window": 8192, "tied_embeddings": True, "ada_rms_norm_t_cond": True,
                    "ada_rms_norm_t_cond_dim": 32},
    }
    model = _new_model("voxtral_realtime", json.loads(json.dumps(config)))
    weights = _shaped(model, shaping or {"scaled": {"tok_embeddings": 0.5, "wo": 6.0, "feed_forward_w2": 6.0,
                                                    "wq": 6.0, "wk": 6.0}})
    probe = mx.array([_TEKKEN_SPECIALS + i for i in range(0, 64, 3)])

    def logits_of(m):
        h, _ = m.decoder.forward(m.decoder.embed_tokens(probe))
        return m.decoder.logits(h)

    _condition_head(model, weights, "decoder.tok_embeddings.weight", range(_TEKKEN_SPECIALS), logits_of,
                    gain="decoder.norm.weight")
    weights = {k: v.astype(mx.float16) if v.ndim == 2 and _VOXTRAL_RT_DIM in v.shape else v
               for k, v in weights.items()}
    _save(folder, config, weights)


# --- MOSS-Music --------------------------------------------------------------------------------

def build_moss_music(folder: Path, shaping: Optional[dict] = None) -> None:
    """MOSS-Music: 128 log-mels (the stem's width, 16 x channels after three stride-2
    convolutions, is written for 128 bins), an encoder over 400-frame chunks whose middle layers
    are also injected ("deepstack") into the first decoder layers, a gated-MLP adapter into a
    Qwen3 decoder with its own lm_head; the prompt is ChatML written in code, the audio run
    marked every 2 s with the tokenizer's digits. It describes music by default: the matrix asks
    it, like a user transcribing, with its default prompt."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
    tok = _train_bpe(folder, specials, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = _ids(tok, specials)
    config = {
        "model_type": "moss_music",
        "audio_config": {"model_type": "moss_music_audio_encoder", "d_model": 32, "output_dim": 32,
                         "num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2,
                         "encoder_ffn_dim": 64, "downsample_rate": 8, "downsample_hidden_size": 8,
                         "max_source_positions": 1500, "n_window": 200, "conv_chunksize": 64,
                         "deepstack_encoder_layer_indexes": [0, 1]},
        "language_config": {"model_type": "qwen3", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                            "head_dim": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                            "rope_theta": 1000000.0, "tie_word_embeddings": False},
        "adapter_hidden_size": 64, "deepstack_num_inject_layers": 2, "sample_rate": 16000,
        "audio_token_id": ids["<|AUDIO|>"], "audio_start_id": ids["<|audio_bos|>"],
        "audio_end_id": ids["<|audio_eos|>"], "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"], "enable_time_marker": True,
        "strip_thinking": True,
    }
    model = _new_model("moss_music", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "audio_encoder": 3.0, "audio_adapter": 3.0}})
    _condition_head(model, weights, "lm_head.weight", _quiet_ids(tok), lambda m: m(_probe_ids(tok)))
    _save(folder, config, weights)


# --- Ming V3 ASR -------------------------------------------------------------------------------

def build_ming_v3_asr(folder: Path, shaping: Optional[dict] = None) -> None:
    """Ming-3.0-ASR: Whisper log-mels (128 bins, rounded through bfloat16 by the model) in
    3000-frame chunks, a Whisper encoder, a strided convolution and a linear layer whose frames,
    scaled to unit length, fill the <|audio_pad|> run after the instruction the code writes; the
    decoder is Bailing-MoE-V3 (a Kimi delta-attention layer and a multi-latent-attention layer, a
    dense MLP then routed experts), decoding greedily with a 10-gram no-repeat rule."""
    specials = ["<|endoftext|>", "<|role_end|>", "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"]
    tok = _train_bpe(folder, specials, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config = {
        "model_type": "ming_v3_asr",
        "audio_token_id": tok.convert_tokens_to_ids("<|audio_pad|>"), "norm_query_embeds": True,
        "audio_config": {"n_mels": 128, "n_audio_ctx": 1500, "n_audio_state": 32, "n_audio_head": 2,
                         "n_audio_layer": 1, "downsampler_kernel_size_list": [3], "downsampler_stride_list": [2],
                         "whisper_chunk_size": 3000},
        "text_config": {"model_type": "bailing_moe_v3", "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "vocab_size": len(tok), "num_attention_heads": 2,
                        "num_key_value_heads": 2, "head_dim": 16, "layer_group_size": 2, "rms_norm_eps": 1e-6,
                        "rope_theta": 10000.0, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                        "qk_rope_head_dim": 8, "v_head_dim": 16, "short_conv_kernel_size": 4, "num_experts": 4,
                        "num_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "moe_shared_expert_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 2,
                        "topk_group": 1, "max_position_embeddings": 4096,
                        "eos_token_id": tok.convert_tokens_to_ids("<|role_end|>")},
    }
    model = _new_model("ming_v3_asr", config)
    weights = _shaped(model, shaping or {"scaled": {"word_embeddings": 0.5, "o_proj": 6.0, "dense": 6.0,
                                                    "down_proj": 6.0, "model.audio": 3.0,
                                                    "linear_proj_audio": 3.0}})
    _condition_head(model, weights, "lm_head.weight", _quiet_ids(tok), lambda m: m(_probe_ids(tok)))
    _save(folder, config, weights)


# --- MiMo-V2.5-ASR -----------------------------------------------------------------------------

# The ASR prompt writes Qwen token ids in code: the Chinese instruction used when the language is
# not English ([44063, 111268, ...]; English picks one of twelve instructions at random, so it is
# not deterministic); the text vocabulary must reach past them. Its embedding and head are the
# folder's bulk, so they are stored in float16 (checkpoints store theirs in half precision).
_MIMO_VOCAB = 111269
_MIMO_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|sosp|>", "<|eosp|>", "<|empty|>",
                  "<|Human|>", "<|SpeechLM|>", "<|sostm|>", "<|eostm|>", "<|eot|>", "<chinese>", "<english>"]
_MIMO_CODEBOOK = 32  # entries of each of the 8 residual codebooks the model reads


def _mimo_audio_tokenizer(folder: Path, shaping: Optional[dict]) -> None:
    """The MiMo audio tokenizer's encoder (24 kHz log-mels, a Whisper-like encoder with rotary
    positions, a residual vector quantizer) in a sub-folder the manifest names."""
    from mlx_audio.stt.models.mimo_v2_asr.audio_encoder import AudioEncoder, AudioEncoderConfig

    config = {"n_mels": 128, "d_model": 32, "kernel_size": 3, "stride_size": 2, "encoder_layers": 2,
              "encoder_skip_layer_id": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "avg_pooler": 2,
              "num_quantizers": 8, "codebook_size": [_MIMO_CODEBOOK] * 8, "sampling_rate": 24000,
              "hop_length": 240, "rope_theta": 10000.0, "ln_type": "LayerNorm"}
    folder.mkdir()
    _save(folder, config, _shaped(AudioEncoder(AudioEncoderConfig.from_dict(config)), shaping))


def build_mimo_v2_asr(folder: Path, shaping: Optional[dict] = None) -> None:
    """MiMo-V2.5-ASR: the audio tokenizer turns 24 kHz audio into 8 streams of codes; groups of 4
    frames are embedded, mixed by an input local transformer and summed into a Qwen2 decoder's
    prompt rows beside text rows (<|empty|> where the row is speech); each step decodes a text
    token (a local transformer would decode speech codes after <|empty|>, which is damped here).
    The sub-folder is named by mlx_manifest.json (the model otherwise looks for a sibling
    MiMo-Audio-Tokenizer folder, or downloads the repository the manifest names)."""
    import mlx.core as mx

    tok = _train_bpe(folder, _MIMO_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = _ids(tok, _MIMO_SPECIALS)
    _mimo_audio_tokenizer(folder / "audio_tokenizer", shaping)
    (folder / "mlx_manifest.json").write_text(json.dumps({"audio_tokenizer_dir": "audio_tokenizer"}))
    config = {
        "model_type": "mimo_v2_asr", "vocab_size": _MIMO_VOCAB, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 640000.0, "max_position_embeddings": 8192,
        "audio_channels": 8, "group_size": 4, "delay_pattern": list(range(8)),
        "speech_vocab_size": "-".join([str(_MIMO_CODEBOOK + 1)] * 8),
        "speech_zeroemb_idx": "-".join([str(_MIMO_CODEBOOK)] * 8),
        "input_local_layers": 1, "input_local_dim": 16, "input_local_attn_heads": 2,
        "input_local_intermediate_size": 32, "input_local_head_dim": 8,
        "local_layers": 1, "local_dim": 16, "local_attn_heads": 2, "local_ffn_dim": 32,
        "local_rotary_base": 640000.0, "out_hidden_size": 16,
        "eot_idx": ids["<|eot|>"], "sosp_idx": ids["<|sosp|>"], "eosp_idx": ids["<|eosp|>"],
        "eostm_idx": ids["<|eostm|>"], "sostm_idx": ids["<|sostm|>"], "speechlm_idx": ids["<|SpeechLM|>"],
        "empty_idx": ids["<|empty|>"],
    }
    model = _new_model("mimo_v2_asr", config)
    weights = _shaped(model, shaping or {"scaled": {**DECODER_SCALED, "speech": 3.0, "input_local": 3.0}})
    quiet = _quiet_ids(tok) + list(range(len(tok), _MIMO_VOCAB))  # ids past the tokenizer decode to nothing

    def logits_of(m):
        return m.model.lm_head(m.model.model(_probe_ids(tok)))

    _condition_head(model, weights, "model.lm_head.weight", quiet, logits_of)
    # sanitize prefixes every key with "model.": the file holds MiMoAudioMLX's own names
    weights = {k[len("model."):]: v.astype(mx.float16) if _MIMO_VOCAB in v.shape else v
               for k, v in weights.items()}
    _save(folder, config, weights)


SHORT = {"max_tokens": 24}  # each clip's transcript: 24 tokens at most


def _recipe(family: str, build: Callable[[Path], None], note: str, generate: Optional[dict] = None) -> AudioRecipe:
    return AudioRecipe(family, "stt", build, generate=dict(generate or SHORT), inputs=CLIPS, note=note)


RECIPES: Dict[str, AudioRecipe] = {r.family: r for r in [
    _recipe("qwen3_asr", build_qwen3_asr, "1-layer encoder, 2-layer Qwen3 decoder, tied head"),
    # The aligner transcribes nothing: it places the words it is given, so both clips answer the
    # same text and differ in the segments' times.
    _recipe("qwen3_forced_aligner", build_qwen3_forced_aligner, "aligns given words: the clips move the times",
            generate={"text": "the quick brown fox jumps over the lazy dog", "language": "English"}),
    _recipe("voxtral_realtime", build_voxtral_realtime,
            "decoder 3072 wide as the adapter's code fixes it (float16 matrices), 1 layer each"),
    _recipe("qwen2_audio", build_qwen2_audio, "1-layer encoder, 2-layer Qwen2 decoder; segment end is wall time"),
    _recipe("glmasr", build_glmasr, "1-layer rotary Whisper encoder, 2-layer Llama decoder"),
    _recipe("granite_speech", build_granite_speech, "2-block Conformer, 1-layer Q-Former, 2-layer Granite"),
    _recipe("fun_asr_nano", build_fun_asr_nano, "1+1-block SANM encoder, 1-block adaptor, 2-layer Qwen3"),
    _recipe("higgs_audio_3", build_higgs_audio_3, "1-layer encoder, 2-layer Qwen3, VAD off; segment end is wall time"),
    _recipe("moss_transcribe_diarize", build_moss_transcribe_diarize, "1-layer Whisper encoder, 2-layer Qwen3"),
    _recipe("moss_music", build_moss_music, "2-layer encoder with deepstack, 2-layer Qwen3 decoder"),
    _recipe("vibevoice_asr", build_vibevoice_asr, "two 7-stage conv tokenizers, 2-layer Qwen2 decoder"),
    _recipe("ming_v3_asr", build_ming_v3_asr, "1-layer encoder, 2-layer Bailing-MoE-V3 (KDA + MLA, 4 experts)"),
    _recipe("mimo_v2_asr", build_mimo_v2_asr, "text vocabulary 111269 (ids fixed in the prompt code), float16 head"),
]}

NOT_BUILT: Dict[str, str] = {
    "voxtral": (
        "its processor is transformers' VoxtralProcessor (AutoProcessor, apply_transcription_request), which "
        "requires PyTorch (declared backend; it concatenates the features with torch.cat and accepts only "
        "return_tensors='pt') and mistral-common (TranscriptionRequest, the Tekken tokenizer); PyPI's torch for "
        "Linux x86_64 is the CUDA build (torch plus about 15 nvidia-* wheels, several GB, and it pins another "
        "numpy), not installed here. The files it reads (tekken.json, the Whisper feature extractor's config) "
        "could be made locally."
    ),
}
