"""Tiny speech-to-text models of mlx-audio's encoder, CTC, transducer and encoder-decoder families.

Each recipe writes a folder that `mlx_audio.stt.utils.load_model` loads as it is: config.json
with a model_type mlx-audio resolves without the folder's name, weights in the key and tensor
layout the family's `sanitize` expects (some transpose every conv weight unconditionally, so
those are written in PyTorch's layout), and every asset its loader reads, all made here: a
byte-level BPE, a word-level `tokenizers` model or a SentencePiece word model of CORPUS, a
vocabulary list in config.json, CMVN statistics measured on probe audio (seeds the matrix does
not send). The weights are the family's own classes' seeded random values (the builder seeds
MLX from the family's name), then conditioned so that decoding is a stable function of the audio:

- the audio reaches the output: subsampling outputs and cross-attention values are scaled up
  (at the initial scale two clips' encoder states differ by hundredths); Whisper, whose windows
  are 30 s of mostly zero padding, gets an "energy" channel its cross-attention keys on;
- only whole words of CORPUS (and blank / end where the family has them) can be emitted: every
  other output row is muted, so no byte fragment or special token becomes text;
- no word wins every step: output rows are centred on the mean state measured over probe
  audio, and decoders keep the input token's dimensions apart from the ones the head reads;
- autoregressive decoders stop on their own: the end token reads a clock of the position (a
  learned positional column, or a sin/cos pair of a fixed table), so they write ten to twenty
  words, never stop at the first step and never run to their limit (Moonshine, with neither
  bias nor absolute position, is bounded by max_tokens instead);
- top-1/top-2 margins are tenths of a logit or more at nearly every step (measured per family).

NOT_BUILT says why the others have no tiny model here.
"""

import json
from pathlib import Path
from typing import Dict, List

from zoo.audio.recipe import AudioRecipe

# Every clip the matrix sends: two seeds of audio_clips.clip, two seconds each.
CLIPS = ((1, 2.0), (2, 2.0))

# What the tokenizers are trained on, and the only words the models may say.
CORPUS = [
    "the river falls past green hills and the old mill",
    "seven small boats drift over the open sea at noon",
    "she reads maps while the rain taps on the window",
    "four quick birds sing above the quiet stone bridge",
    "we count ten stars and twelve clouds before night",
    "bright lamps glow along the narrow winding road",
    "yes no maybe later now today tomorrow",
]
WORDS = sorted({w for line in CORPUS for w in line.split()})

MUTE = -40.0  # the logit offset of a row that must never be emitted


# ---------------------------------------------------------------- shared helpers


def _np(a):
    import mlx.core as mx
    import numpy as np

    return np.array(a.astype(mx.float32))


def _normal(shape, scale: float = 1.0):
    """Seeded standard-normal values (MLX's generator, which the builder seeds) as numpy."""
    import mlx.core as mx

    return _np(mx.random.normal(shape)) * scale


def _params(model) -> Dict[str, object]:
    """The model's parameters as float32 numpy arrays, by their dotted names."""
    from mlx.utils import tree_flatten

    return {k: _np(v) for k, v in tree_flatten(model.parameters())}


def _save(folder: Path, weights: Dict[str, object], dtype: str = "float32", name: str = "model.safetensors",
          keep=()):
    """Writes `weights` as `dtype`, except the keys in `keep`, written in their own dtype."""
    import mlx.core as mx

    cast = getattr(mx, dtype)
    mx.save_safetensors(str(folder / name),
                        {k: mx.array(v) if k in keep else mx.array(v).astype(cast) for k, v in weights.items()})


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1))


def _energy_mask(n_mels: int):
    """Per-mel weights of the energy channel: +1/n over the lowest 5/16 of the mel bins,
    -1/n over the highest 6/16 (a voiced frame is loud low and quiet high; the room noise of
    a gap is flat; padding is flat or zero)."""
    import numpy as np

    low, high = n_mels * 5 // 16, n_mels * 10 // 16
    mask = np.zeros(n_mels, np.float32)
    mask[:low] = 1.0 / low
    mask[high:] = -1.0 / (n_mels - high)
    return mask


def _probe_clips():
    """Audio the builds measure their models on: seeds the matrix does not send."""
    from audio_clips import clip

    return [clip(seed, 2.0) for seed in (11, 12, 13)]


def _byte_bpe():
    """(vocab, merges) of a byte-level BPE trained on CORPUS: the 256 byte symbols, then merges
    up to every corpus word with its leading space."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([" " + line for line in CORPUS] * 4, trainer)
    model = json.loads(bpe.to_str())["model"]
    return dict(model["vocab"]), [tuple(m) for m in model["merges"]]


# ---------------------------------------------------------------- whisper
#
# mlx-audio's Whisper: MLX-format config.json (n_mels, n_audio_ctx, ...), weights in MLX key
# layout (encoder.blocks.N.attn.query...), a Hugging Face WhisperTokenizer and feature-extractor
# config (post_load_hook loads WhisperProcessor; decoding reads every special token by name).
# The layout is large-v3's: 128 mels, 51866 rows (multilingual, 100 languages), text tokens
# 0..50256 (a BPE of CORPUS padded with tokens no text contains), <|endoftext|> at 50257, then
# <|startoftranscript|>, the languages, the task and prompt tokens, and 1501 timestamps.
# n_audio_ctx must stay 1500: the code pads every window to 30 s (3000 mel frames).

WHISPER = dict(width=32, heads=2, layers=2, mels=128, vocab=51866)


def _whisper_tokenizer(folder: Path):
    """The tokenizer and feature-extractor files; returns (tokenizer, ids of the words)."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES
    from transformers import WhisperFeatureExtractor, WhisperTokenizer

    vocab, merges = _byte_bpe()
    for i in range(len(vocab), 50257):  # the text rows of the real vocabulary: never produced
        vocab[f"Ġ#{i}"] = i
    tok = WhisperTokenizer(vocab=vocab, merges=merges)  # <|endoftext|> (eos, unk) becomes 50257
    specials = (["<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGUAGES]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"])
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    tok.save_pretrained(str(folder))
    WhisperFeatureExtractor(feature_size=WHISPER["mels"]).save_pretrained(str(folder))
    words = {tok.convert_tokens_to_ids("Ġ" + w) for w in WORDS}
    assert len(tok) == WHISPER["vocab"] and tok.unk_token_id not in words
    return tok, sorted(words)


def _whisper_encoder(w: Dict[str, object], n_mels: int, heads: int, width: int, layers: int):
    """Conv channel 0 carries the clip's energy (gelu(10 * contrast - 2): several units on voiced
    frames, about zero in gaps and in the zero-padded rest of the 30 s window); every decoder
    cross-attention head gets a key on that channel and a constant query, so attention lands on
    the voiced frames; the other query/key rows are scaled so each step attends to its own
    frames, and the values are scaled so what is heard reaches the text."""
    import numpy as np

    w["encoder.conv1.weight"] *= 4.0
    w["encoder.conv2.weight"] *= 4.0
    w["encoder.conv1.weight"][0] = 10.0 / 3 * _energy_mask(n_mels)[None, :]  # (out, tap, mel)
    w["encoder.conv1.bias"][0] = -2.0
    w["encoder.conv2.weight"][0] = 0.0
    w["encoder.conv2.weight"][0, 1, 0] = 1.0  # the centre tap passes the energy through
    w["encoder.conv2.bias"][0] = 0.0
    hd = width // heads
    focus = np.sqrt(4.0 * np.sqrt(hd))  # query x key on the energy channel: +4 logits per unit
    for i in range(layers):
        pre = f"decoder.blocks.{i}.cross_attn."
        for name in ("query.weight", "key.weight"):
            w[pre + name] *= 3.0
        for name in ("value.weight", "out.weight"):
            w[pre + name] *= 1.5
        for h in range(heads):
            w[pre + "key.weight"][h * hd] = 0.0
            w[pre + "key.weight"][h * hd, 0] = focus
            w[pre + "query.weight"][h * hd] = 0.0
            w[pre + "query.bias"][h * hd] = focus


def _whisper_head(w: Dict[str, object], tok, words: List[int], width: int, layers: int):
    """The tied token embedding as input and output head. Dimension 0 is a bias channel (the
    final LayerNorm writes a constant 16 there), 1..7 carry the input token's identity (not
    read by the head, so a token does not predict itself), 8..30 are what the head reads
    (small in the input), 31 a clock: the positional embedding ramps there and only
    <|endoftext|> reads it, so text ends after about ten words."""
    import numpy as np

    vocab = WHISPER["vocab"]
    bias_scale, ident, clock = 16.0, 8, width - 1
    eps, text_std = 0.05, 32.0
    E = np.zeros((vocab, width), np.float32)
    E[:, 1:ident] = _normal((vocab, ident - 1))
    E[words, ident:clock] = _normal((len(words), clock - ident), eps)
    eot = tok.eos_token_id
    ts0 = tok.convert_tokens_to_ids("<|0.00|>")
    bias = np.full(vocab, MUTE)
    bias[words] = 0.0
    bias[eot + 1:ts0] = -30.0  # start, languages, tasks, prompt, no-speech, no-timestamps
    # Language detection compares only the language rows: English by ten logits.
    bias[tok.convert_tokens_to_ids("<|en|>")] = -20.0
    bias[eot] = 14.0
    bias[ts0:] = -12.0
    bias[ts0] = 0.0  # the first token must be a timestamp: <|0.00|>, by twelve logits
    # All offsets lowered together, so the leading words' logits sit near zero, where float16
    # (the model's dtype) resolves them finely, rather than near 80.
    E[:, 0] = (bias - 1.5 * text_std) / bias_scale
    E[eot, clock] = 0.5
    w["decoder.token_embedding.weight"] = E
    gain = np.zeros(width, np.float32)
    gain[ident:] = text_std / (eps * np.sqrt(clock - ident))
    shift = np.zeros(width, np.float32)
    shift[0] = bias_scale
    w["decoder.ln.weight"], w["decoder.ln.bias"] = gain, shift
    pos = _normal(w["decoder.positional_embedding"].shape, 0.5)
    pos[:, clock] = 2.0 * np.tanh((np.arange(pos.shape[0]) - 14) / 3.0)
    w["decoder.positional_embedding"] = pos
    for i in range(layers):  # nothing but the positional embedding writes the clock
        for part in ("attn.out", "cross_attn.out", "mlp2"):
            w[f"decoder.blocks.{i}.{part}.weight"][clock] = 0.0
            w[f"decoder.blocks.{i}.{part}.bias"][clock] = 0.0
    return ident, clock


def _whisper_center(w, cfg, tok, words, ident, clock):
    """Removes from the word rows the direction the head's input keeps at every step (the
    audio summary and the biases): left in, one word wins every step."""
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    model = Model(ModelDimensions.from_dict(cfg))
    model.load_weights([(k, mx.array(v).astype(mx.float16)) for k, v in w.items()])
    start = [tok.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                     "<|0.00|>")]
    states = []
    for n, audio in enumerate(_probe_clips()):
        mel = pad_or_trim(log_mel_spectrogram(audio, n_mels=cfg["n_mels"]), N_FRAMES, axis=-2)
        audio_features = model.encoder(mel.astype(mx.float16)[None])
        text = [words[(7 * j + 3 * n) % len(words)] for j in range(16)]
        dec = model.decoder
        x = dec.token_embedding(mx.array([start + text])) + dec.positional_embedding[:len(start) + len(text)]
        for block in dec.blocks:
            x, _, _ = block(x, audio_features, mask=dec._mask)
        states.append(_np(dec.ln(x))[0, 3:, ident:clock])
    mean = np.concatenate(states).mean(0)
    mean /= np.linalg.norm(mean)
    rows = w["decoder.token_embedding.weight"][words, ident:clock]
    w["decoder.token_embedding.weight"][words, ident:clock] = rows - np.outer(rows @ mean, mean)


def build_whisper(folder: Path) -> None:
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    d = WHISPER
    cfg = {"model_type": "whisper", "n_mels": d["mels"], "n_audio_ctx": 1500, "n_audio_state": d["width"],
           "n_audio_head": d["heads"], "n_audio_layer": d["layers"], "n_vocab": d["vocab"], "n_text_ctx": 448,
           "n_text_state": d["width"], "n_text_head": d["heads"], "n_text_layer": d["layers"]}
    tok, words = _whisper_tokenizer(folder)
    _write_json(folder / "config.json", cfg)
    w = _params(Model(ModelDimensions.from_dict(cfg)))
    _whisper_encoder(w, d["mels"], d["heads"], d["width"], d["layers"])
    ident, clock = _whisper_head(w, tok, words, d["width"], d["layers"])
    _whisper_center(w, cfg, tok, words, ident, clock)
    _save(folder, w, "float16")  # the model's own dtype: sanitize casts every weight to it


# ---------------------------------------------------------------- parakeet (TDT)
#
# mlx-audio reads a NeMo model config converted to JSON: `target` and model_defaults.tdt_durations
# pick the TDT model; the vocabulary (SentencePiece pieces, "▁" for a space) is a list in
# joint.vocabulary, so no tokenizer file is read. No sanitize: the weights carry the module's
# own names. Greedy TDT: per encoder frame (80 ms) the joint picks a token or blank and a
# duration (frames to skip); max_symbols caps the tokens at one frame.

PARAKEET_DURATIONS = [0, 1, 2, 3, 4]


def _nemo_vocabulary() -> List[str]:
    """A SentencePiece-style vocabulary: <unk> first, as NeMo's are, then the corpus words."""
    return ["<unk>"] + ["\u2581" + w for w in WORDS]


def _nemo_preprocessor(features: int) -> dict:
    return {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor", "sample_rate": 16000,
            "normalize": "per_feature", "window_size": 0.025, "window_stride": 0.01, "window": "hann",
            "features": features, "n_fft": 512, "log": True, "frame_splicing": 1, "dither": 0.0, "pad_to": 0,
            "pad_value": 0.0}


def _conformer(features: int, width: int, layers: int) -> dict:
    return {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": features, "feat_out": -1,
            "n_layers": layers, "d_model": width, "subsampling": "dw_striding", "subsampling_factor": 8,
            "subsampling_conv_channels": 16, "causal_downsampling": False, "ff_expansion_factor": 2,
            "self_attention_model": "rel_pos", "n_heads": 2, "att_context_size": [-1, -1], "xscaling": True,
            "untie_biases": True, "pos_emb_max_len": 5000, "conv_kernel_size": 9, "conv_norm_type": "batch_norm"}


# At the library's initial scale the subsampling's output is a small part of what the conformer
# blocks add (biases, positions): two clips' encoder states then differ by a few hundredths.
# Scaled up, the frames carry the clip.
SUBSAMPLING_GAIN = 16.0


def _parakeet_config() -> dict:
    vocabulary = _nemo_vocabulary()
    width, hidden = 32, 32
    return {
        "model_type": "parakeet",  # NeMo's own config has none: the loader would go by the folder's name
        "target": "nemo.collections.asr.models.rnnt_bpe_models.EncDecRNNTBPEModel",
        "model_defaults": {"enc_hidden": width, "pred_hidden": hidden, "joint_hidden": hidden,
                           "tdt_durations": PARAKEET_DURATIONS, "num_tdt_durations": len(PARAKEET_DURATIONS)},
        "preprocessor": _nemo_preprocessor(80),
        "encoder": _conformer(80, width, 2),
        "decoder": {"_target_": "nemo.collections.asr.modules.RNNTDecoder", "blank_as_pad": True,
                    "vocab_size": len(vocabulary), "prednet": {"pred_hidden": hidden, "pred_rnn_layers": 1}},
        "joint": {"_target_": "nemo.collections.asr.modules.RNNTJoint", "num_classes": len(vocabulary),
                  "vocabulary": vocabulary, "num_extra_outputs": len(PARAKEET_DURATIONS),
                  "jointnet": {"joint_hidden": hidden, "activation": "relu", "encoder_hidden": width,
                               "pred_hidden": hidden}},
        "decoding": {"strategy": "greedy_batch", "model_type": "tdt", "durations": PARAKEET_DURATIONS,
                     "greedy": {"max_symbols": 10}},
    }


def _joint_hidden(model, w: Dict[str, object], frames_of) -> object:
    """The joint network's hidden activations (after its ReLU) over the probe clips' encoder
    frames (`frames_of(model, audio)` -> (T, width)) and a few prediction-network states, as an
    (n, hidden) numpy array."""
    import mlx.core as mx
    import numpy as np

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    frames = mx.concatenate([frames_of(model, mx.array(audio)) for audio in _probe_clips()])
    states = [model.decoder(None)[0][0, -1]]
    for token in range(1, 9):
        states.append(model.decoder(mx.array([[token]]))[0][0, -1])
    hidden = mx.maximum(model.joint.enc(frames)[:, None, :] + model.joint.pred(mx.stack(states))[None, :, :], 0.0)
    return np.array(hidden.reshape(-1, hidden.shape[-1]))


def _parakeet_frames(model, audio):
    return model.encoder(model._log_mel_spectrogram(audio))[0][0]


def _joint_output(w: Dict[str, object], key: str, hidden, n_tokens: int, blank: float, token_std: float,
                  durations: List[float], blank_jitter: float = 1.0):
    """The joint's last layer, centred on the probe's mean hidden state (else the same word wins
    every frame): token logits spread by `token_std` (<unk> muted), blank at `blank`, each
    duration at its offset (a little audio-dependence left in them)."""
    import numpy as np

    W, b = w[key + ".weight"], w[key + ".bias"]
    centred = hidden - hidden.mean(0)
    spread = np.std(centred @ W[1:n_tokens].T)
    W[:n_tokens + 1] *= token_std / spread
    W[n_tokens] *= blank_jitter  # how much the blank's logit moves with the frame
    W[n_tokens + 1:] *= 1.0 / spread
    b[:] = -(W @ hidden.mean(0))
    b[0] += MUTE
    b[n_tokens] += blank
    b[n_tokens + 1:] += durations


def build_parakeet(folder: Path) -> None:
    from mlx_audio.stt.models.parakeet.parakeet import Model, ModelConfig

    cfg = _parakeet_config()
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(cfg))
    w = _params(model)
    w["encoder.pre_encode.out.weight"] *= SUBSAMPLING_GAIN
    n = len(cfg["joint"]["vocabulary"])
    _joint_output(w, "joint.joint_net.2", _joint_hidden(model, w, _parakeet_frames), n, blank=8.0, token_std=4.0,
                  durations=[-6.0, 1.0, 1.0, 0.0, -2.0])
    _save(folder, w)


# ---------------------------------------------------------------- CTC heads


def _ctc_head(W, b, hidden, speak: List[int], blank: int, token_std: float, blank_offset: float):
    """A CTC output layer (rows = tokens) conditioned on `hidden`, the encoder's states over the
    probe clips: centred (each row's mean logit over the probe is zero, so no token wins every
    frame), the word rows spread by `token_std`, blank lifted by `blank_offset` so a good part
    of the frames are blank, every other row muted."""
    import numpy as np

    mean = hidden.mean(0)
    keep = list(speak) + [blank]
    spread = np.std((hidden - mean) @ W[speak].T)
    W[keep] *= token_std / spread
    b[keep] = -(W[keep] @ mean)
    b[blank] += blank_offset
    others = np.ones(W.shape[0], bool)
    others[keep] = False
    W[others] = 0.0
    b[others] = MUTE


def _torch_conv(weights: Dict[str, object], suffixes) -> None:
    """Conv weights of MLX's (out, kernel, in) written in PyTorch's (out, in, kernel), for the
    families whose sanitize swaps those keys back unconditionally."""
    for key in list(weights):
        if key.endswith(tuple(suffixes)) and weights[key].ndim == 3:
            weights[key] = weights[key].swapaxes(1, 2)


# ---------------------------------------------------------------- mms
#
# mlx-audio's MMS: the wav2vec2 encoder (mlx_audio.stt.models.wav2vec) plus lm_head, a
# character CTC. config.json is the Hugging Face Wav2Vec2ForCTC config with model_type "mms"
# (a real MMS config says "wav2vec2", which mlx-audio resolves only from a folder name with
# "mms" in it). The processor files (vocab.json, tokenizer and feature-extractor configs) are
# a Wav2Vec2Processor's; post_load_hook decodes with it. sanitize swaps every ".conv.weight"
# (and the weight-norm g/v of the positional conv) from PyTorch's layout.

MMS_CHARS = list("abcdefghijklmnopqrstuvwxyz'")


def _mms_config() -> dict:
    return {"model_type": "mms", "architectures": ["Wav2Vec2ForCTC"], "vocab_size": 5 + len(MMS_CHARS),
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "hidden_act": "gelu", "feat_extract_norm": "layer", "feat_extract_activation": "gelu",
            "conv_dim": [16] * 7, "conv_stride": [5, 2, 2, 2, 2, 2, 2], "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
            "conv_bias": True, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
            "num_feat_extract_layers": 7, "do_stable_layer_norm": True, "layer_norm_eps": 1e-5,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _mms_processor(folder: Path) -> None:
    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2Processor

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4}
    vocab.update({c: 5 + i for i, c in enumerate(MMS_CHARS)})
    _write_json(folder / "vocab.json", vocab)
    tok = Wav2Vec2CTCTokenizer(str(folder / "vocab.json"), word_delimiter_token="|")
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                  return_attention_mask=True)
    Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok).save_pretrained(str(folder))


def build_mms(folder: Path) -> None:
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.mms.mms import Model
    from mlx_audio.stt.models.wav2vec.wav2vec import ModelConfig

    cfg = _mms_config()
    _write_json(folder / "config.json", cfg)
    _mms_processor(folder)
    model = Model(ModelConfig.from_dict(cfg))
    w = _params(model)
    states = []
    for audio in _probe_clips():
        x = mx.array(audio)[None]
        x = (x - x.mean()) / (x.std() + 1e-7)  # as generate normalises
        states.append(_np(model.wav2vec2(x).last_hidden_state[0]))
    speak = list(range(4, cfg["vocab_size"]))  # the word delimiter and the letters
    _ctc_head(w["lm_head.weight"], w["lm_head.bias"], np.concatenate(states), speak, blank=0,
              token_std=6.0, blank_offset=9.0)
    _torch_conv(w, (".conv.weight", ".conv.weight_g", ".conv.weight_v"))
    _save(folder, w)


# ---------------------------------------------------------------- granite_speech5_ctc
#
# Granite Speech 5 TurboCTC: a conformer with block-local attention whose CTC head (encoder.out)
# also feeds the self-conditioning at the middle layer; 80 mel bins are fixed in code (the
# filters are computed at import). post_load_hook reads tokenizer.json with `tokenizers`; here a
# word-level tokenizer whose id 0 is the blank (pad_token_id).


def _word_tokenizer(specials: List[str]):
    """A `tokenizers` word-level tokenizer: `specials` first (id 0 = the first), then WORDS;
    decoding joins words with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    return tok


def build_granite_speech5_ctc(folder: Path) -> None:
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.granite_speech5_ctc.config import ModelConfig
    from mlx_audio.stt.models.granite_speech5_ctc.granite_speech5 import Model, compute_features

    specials = ["<pad>", "<unk>"]
    tok = _word_tokenizer(specials)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    encoder = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 2, "num_mel_bins": 80, "head_dim": 16,
               "hidden_act": "silu", "max_position_embeddings": 32, "context_size": 32, "conv_kernel_size": 7,
               "conv_expansion_factor": 2, "subsample_layers": [0, 1], "attention_bias": True,
               "model_type": "granite_speech5_encoder"}
    cfg = {"model_type": "granite_speech5_ctc", "architectures": ["GraniteSpeech5CTCForConditionalGeneration"],
           "vocab_size": vocab, "pad_token_id": 0, "tie_word_embeddings": True, "encoder_config": encoder}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(dict(cfg)))
    w = _params(model)
    states = [_np(model.encoder(compute_features(mx.array(a), num_mel_bins=80)[None])[0]) for a in _probe_clips()]
    speak = list(range(len(specials), vocab))
    _ctc_head(w["encoder.out.weight"], w["encoder.out.bias"], np.concatenate(states), speak, blank=0,
              token_std=6.0, blank_offset=6.0)
    _save(folder, w)


# ---------------------------------------------------------------- sensevoice
#
# SenseVoice-Small: Kaldi fbank (80 mels), low-frame-rate stacking (7 frames every 6: 560
# features, 60 ms), CMVN from am.mvn (Kaldi nnet text: AddShift = -mean, Rescale = 1/std), a
# SAN-M encoder after four query positions (language, event, emotion, text normalisation) and a
# CTC head; text from the SentencePiece model under its checkpoint name. The rich labels
# (language, emotion, event) are read at fixed token ids of the 25055-row vocabulary; this one
# has 59 rows, so they come out "unknown" / "token_N".


def _sentencepiece(user_symbols: List[str] = (), **options) -> bytes:
    """A SentencePiece word model of CORPUS (every word one piece, "▁" + word), `user_symbols`
    right after <unk>, <s>, </s>; the serialized model."""
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 4), model_writer=out, vocab_size=400,
                                   model_type="word", character_coverage=1.0, num_threads=1,
                                   hard_vocab_limit=False, minloglevel=2, user_defined_symbols=list(user_symbols),
                                   **options)
    return out.getvalue()


def _pieces(model: bytes) -> List[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _word_ids(pieces: List[str]) -> List[int]:
    return [i for i, p in enumerate(pieces) if p.startswith("\u2581") and p[1:] in WORDS]


def _kaldi_mvn(means, istd) -> str:
    """am.mvn in Kaldi's nnet text format, as FunASR ships it."""
    n = len(means)
    row = lambda v: " ".join(f"{x:.6f}" for x in v)  # noqa: E731
    return (f"<Nnet>\n<Splice> {n} {n}\n[ 0 ]\n<AddShift> {n} {n}\n<LearnRateCoef> 0 [ {row(-means)} ]\n"
            f"<Rescale> {n} {n}\n<LearnRateCoef> 0 [ {row(istd)} ]\n</Nnet>\n")


def build_sensevoice(folder: Path) -> None:
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.sensevoice.config import ModelConfig
    from mlx_audio.stt.models.sensevoice import Model

    spm_model = _sentencepiece()
    (folder / "chn_jpn_yue_eng_ko_spectok.bpe.model").write_bytes(spm_model)
    pieces = _pieces(spm_model)
    cfg = {"model_type": "sensevoice", "vocab_size": len(pieces), "input_size": 560,
           "encoder_conf": {"output_size": 32, "attention_heads": 2, "linear_units": 64, "num_blocks": 2,
                            "tp_blocks": 1, "kernel_size": 11, "sanm_shfit": 0, "normalize_before": True},
           "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                             "lfr_m": 7, "lfr_n": 6}}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    feats = [_np(model._extract_features(mx.array(a))) for a in _probe_clips()]
    every = np.concatenate(feats)
    means, istd = every.mean(0), 1.0 / (every.std(0) + 1e-5)
    (folder / "am.mvn").write_text(_kaldi_mvn(means, istd))
    model._cmvn_means, model._cmvn_istd = mx.array(-means), mx.array(istd)  # as post_load_hook reads them
    w = _params(model)
    states = []
    for f in feats:
        x = (mx.array(f) + model._cmvn_means) * model._cmvn_istd
        textnorm, query = model._build_query(1)
        speech = mx.concatenate([query, textnorm, x[None]], axis=1)
        states.append(_np(model.encoder(speech)[0, 4:]))
    _ctc_head(w["ctc_lo.weight"], w["ctc_lo.bias"], np.concatenate(states), _word_ids(pieces), blank=0,
              token_std=6.0, blank_offset=13.0)
    _torch_conv(w, ("fsmn_block.weight",))  # sanitize transposes it back unconditionally
    _save(folder, w)


# ---------------------------------------------------------------- attention decoders with a fixed sinusoid
#
# Canary's and Cohere's decoders add NeMo's fixed sinusoidal table (sin at even, cos at odd
# dimensions, scaled by 1/sqrt(d)) to the token embedding, normalise, run pre-norm blocks and a
# final LayerNorm into an untied output layer. Their end token is made to follow the position:
# one sin/cos pair of the table is kept clear of the token embeddings and of every block's
# output, so after both LayerNorms it still holds sin(f p) - cos(f p) up to a positive factor;
# the end row reads exactly that difference, whose sign changes at f p = pi/4, and is scaled so
# the change is tens of logits a step. Before it the end token cannot win, after it nothing else can.


def _clock_pair(width: int, end_position: float):
    """(sin dimension, cos dimension, crossing position) of the table's pair whose
    sin - cos changes sign nearest after `end_position`."""
    import math

    best = None
    for i in range(width // 2):
        f = math.exp(-2 * i * math.log(10000.0) / width)
        cross = math.pi / 4 / f
        if cross >= end_position and (best is None or cross < best[2]):
            best = (2 * i, 2 * i + 1, cross)
    return best


def _sinusoid_decoder(w: Dict[str, object], *, width: int, embed: str, embed_norm: str, writers: List[str],
                      final_norm: str, head: str, words: List[int], end: int, end_position: float):
    """Conditions a sinusoid decoder (key names given) as the section above says; the word
    rows of `head` are random on the dimensions it reads, every other row muted. Returns the
    dimensions the head does not read (for _centre_rows)."""
    import numpy as np

    a, b, _ = _clock_pair(width, end_position)
    # The token embedding lives in the first half of the dimensions and the head reads only the
    # second: a token's own vector does not reach its logits, so no token predicts itself.
    ident = [i for i in range(width // 2) if i not in (a, b)]
    read = [i for i in range(width // 2, width) if i not in (a, b)]
    E = w[embed + ".weight"]
    E[:, [i for i in range(width) if i not in ident]] = 0.0
    E[:, ident] -= E[:, ident].mean(1, keepdims=True)  # zero-mean rows: the LayerNorm's mean is the table's
    w[embed_norm + ".weight"][[a, b]] = 10.0
    w[embed_norm + ".bias"][[a, b]] = 0.0
    for key in writers:  # no block writes the clock
        w[key + ".weight"][[a, b]] = 0.0
        w[key + ".bias"][[a, b]] = 0.0
    w[final_norm + ".weight"][[a, b]] = 1.0
    w[final_norm + ".bias"][[a, b]] = 0.0
    W, bias = w[head + ".weight"], w[head + ".bias"]
    W[:] = 0.0
    bias[:] = MUTE
    W[np.ix_(words, read)] = _normal((len(words), len(read)), 6.0 / np.sqrt(len(read)))
    bias[words] = 0.0
    W[end, a], W[end, b] = 100.0, -100.0
    bias[end] = 0.0
    return [i for i in range(width) if i not in read]


def _centre_rows(W, rows: List[int], states, skip: List[int], spread: float = 8.0) -> None:
    """Removes from W's `rows` the mean direction of `states` (the head's inputs over a probe),
    outside the `skip` dimensions: the part every step shares, which would make one row win
    every step; then scales them so their logits over the probe have `spread` standard deviation."""
    import numpy as np

    keep = [i for i in range(W.shape[1]) if i not in skip]
    mean = states[:, keep].mean(0)
    mean /= np.linalg.norm(mean)
    sub = W[np.ix_(rows, keep)]
    sub = sub - np.outer(sub @ mean, mean)
    W[np.ix_(rows, keep)] = sub * spread / np.std(states[:, keep] @ sub.T)


# ---------------------------------------------------------------- canary
#
# Canary (AED): a FastConformer encoder (parakeet's Conformer) and a NeMo transformer decoder
# prompted with <|startofcontext|> <|startoftranscript|> <|emo:undefined|> <|src|> <|tgt|>
# <|pnc|> <|noitn|> <|notimestamp|> <|nodiarize|>, all looked up by name in tokenizer.model
# (SentencePiece); the end token is <|endoftext|>. Weights under the module's own names
# ("decoder.blocks." present: sanitize passes them through unchanged).

CANARY_LANGUAGES = ["bg", "hr", "cs", "da", "nl", "en", "et", "fi", "fr", "de", "el", "hu", "it", "lv", "lt", "mt",
                    "pl", "pt", "ro", "sk", "sl", "es", "sv", "ru", "uk"]
CANARY_SPECIALS = (["<|endoftext|>", "<|startofcontext|>", "<|startoftranscript|>", "<|emo:undefined|>", "<|pnc|>",
                    "<|nopnc|>", "<|itn|>", "<|noitn|>", "<|timestamp|>", "<|notimestamp|>", "<|diarize|>",
                    "<|nodiarize|>"] + [f"<|{c}|>" for c in CANARY_LANGUAGES])


def _canary_states(model, w, prompt: List[int], words: List[int]):
    """The decoder's final-norm states over the probe clips, the prompt then words."""
    import mlx.core as mx
    import numpy as np

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    out = []
    for n, audio in enumerate(_probe_clips()):
        enc, _, mask = model._encode_audio(model._preprocess_audio(mx.array(audio)))
        tokens = prompt + [words[(5 * j + n) % len(words)] for j in range(12)]
        dec = model.decoder
        x = dec.embedding(mx.array([tokens])) + dec.position_embedding(mx.arange(len(tokens))[None])
        x = dec.embedding_layer_norm(x)
        causal = _causal_mask(len(tokens))
        for block in dec.blocks:
            x, _, _ = block(x, enc, encoder_mask=mask, self_attn_mask=causal)
        out.append(_np(dec.final_norm(x))[0, len(prompt) - 1:])
    return np.concatenate(out)


def _causal_mask(n: int):
    import mlx.nn as nn

    return nn.MultiHeadAttention.create_additive_causal_mask(n)


def build_canary(folder: Path) -> None:
    from mlx_audio.stt.models.canary.canary import Model
    from mlx_audio.stt.models.canary.config import ModelConfig
    from mlx_audio.stt.models.canary.tokenizer import CanaryTokenizer

    spm_model = _sentencepiece(CANARY_SPECIALS)
    (folder / "tokenizer.model").write_bytes(spm_model)
    pieces = _pieces(spm_model)
    width = 32
    enc = _conformer(80, width, 2)
    cfg = {"model_type": "canary", "vocab_size": len(pieces), "enc_output_dim": width,
           "preprocessor": _nemo_preprocessor(80), "encoder": enc,
           "transf_decoder": {"num_layers": 2, "hidden_size": width, "num_attention_heads": 2, "inner_size": 64},
           "supported_languages": CANARY_LANGUAGES}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    w = _params(model)
    w["encoder.conformer.pre_encode.out.weight"] *= SUBSAMPLING_GAIN
    tok = CanaryTokenizer(model_proto=spm_model)
    words = _word_ids(pieces)
    prompt = tok.build_prompt_tokens("en", "en", True)
    writers = [f"decoder.blocks.{i}.{part}" for i in range(2) for part in ("self_attn.out_proj", "cross_attn.out_proj",
                                                                             "ff2")]
    skip = _sinusoid_decoder(w, width=width, embed="decoder.embedding", embed_norm="decoder.embedding_layer_norm",
                             writers=writers, final_norm="decoder.final_norm", head="decoder.output_proj",
                             words=words, end=tok.eos_id, end_position=len(prompt) + 12)
    _centre_rows(w["decoder.output_proj.weight"], words, _canary_states(model, w, prompt, words), skip)
    _save(folder, w)


# ---------------------------------------------------------------- cohere_asr
#
# Cohere Transcribe: a conformer encoder of its own, a NeMo-style transformer decoder (fixed
# sinusoid, as Canary's) prompted like Canary's with the language twice, and an output layer
# (log_softmax.mlp.layer0). post_load_hook reads tokenizer.model (SentencePiece) with
# tokenizer_config.json / special_tokens_map.json for the special tokens; the prompt's tokens
# are looked up by piece (a missing one silently becomes <unk>). Weights under the module's
# own names pass sanitize unchanged (it only renames NeMo keys and transposes mismatched shapes).

COHERE_LANGUAGES = ["en", "fr", "de", "es", "it", "pt", "nl", "pl", "el", "ar", "ja", "zh", "vi", "ko"]
COHERE_SPECIALS = (["<pad>", "<|endoftext|>", "<|startoftranscript|>", "<|startofcontext|>", "<|emo:undefined|>",
                    "<|pnc|>", "<|nopnc|>", "<|itn|>", "<|noitn|>", "<|timestamp|>", "<|notimestamp|>",
                    "<|diarize|>", "<|nodiarize|>"] + [f"<|{c}|>" for c in COHERE_LANGUAGES])


def _cohere_states(model, w, prompt: List[int], words: List[int]):
    import mlx.core as mx
    import numpy as np

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    out = []
    for n, audio in enumerate(_probe_clips()):
        enc, _, mask = model._encode_waveforms([mx.array(audio)])
        tokens = prompt + [words[(5 * j + n) % len(words)] for j in range(12)]
        hidden, _ = model.transf_decoder(mx.array([tokens]), enc, encoder_mask=mask)
        out.append(_np(hidden)[0, len(prompt) - 1:])
    return np.concatenate(out)


def build_cohere_asr(folder: Path) -> None:
    from mlx_audio.stt.models.cohere_asr.cohere_asr import Model
    from mlx_audio.stt.models.cohere_asr.config import ModelConfig
    from mlx_audio.stt.models.cohere_asr.tokenizer import CohereAsrTokenizer

    spm_model = _sentencepiece(COHERE_SPECIALS)
    (folder / "tokenizer.model").write_bytes(spm_model)
    names = {"bos_token": "<|startoftranscript|>", "eos_token": "<|endoftext|>", "pad_token": "<pad>",
             "unk_token": "<unk>"}
    extra = [t for t in COHERE_SPECIALS if t not in names.values()]
    _write_json(folder / "tokenizer_config.json", {**names, "additional_special_tokens": extra})
    _write_json(folder / "special_tokens_map.json", {**names, "additional_special_tokens": extra})
    pieces = _pieces(spm_model)
    width = 32
    enc = _conformer(80, width, 2)
    enc["xscaling"] = False
    cfg = {"model_type": "cohere_asr", "vocab_size": len(pieces), "encoder": enc,
           "transf_decoder": {"config_dict": {"hidden_size": width, "inner_size": 64, "num_attention_heads": 2,
                                              "num_layers": 2, "hidden_act": "relu", "max_sequence_length": 512}},
           "head": {"hidden_size": width, "num_classes": len(pieces), "log_softmax": True},
           "preprocessor": _nemo_preprocessor(80), "supported_languages": COHERE_LANGUAGES}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    w = _params(model)
    w["encoder.pre_encode.out.weight"] *= SUBSAMPLING_GAIN
    for i in range(2):  # a stronger feed-forward: each step's token moves the state (fewer repeats)
        for part in ("dense_in", "dense_out"):
            w[f"transf_decoder.decoder.layers.{i}.third_sub_layer.{part}.weight"] *= 2.0
    tok = CohereAsrTokenizer(str(folder / "tokenizer.model"), str(folder / "tokenizer_config.json"),
                             str(folder / "special_tokens_map.json"))
    model._tokenizer = tok
    words = _word_ids(pieces)
    prompt = tok.build_prompt_tokens("en", True)
    core = "transf_decoder.decoder"
    writers = [f"{core}.layers.{i}.{part}" for i in range(2) for part in ("first_sub_layer.out_projection",
                                                                          "second_sub_layer.out_projection",
                                                                          "third_sub_layer.dense_out")]
    skip = _sinusoid_decoder(w, width=width, embed="transf_decoder.embedding.token_embedding",
                             embed_norm="transf_decoder.embedding.layer_norm", writers=writers,
                             final_norm=f"{core}.final_layer_norm", head="log_softmax.mlp.layer0", words=words,
                             end=tok.eos_token_id, end_position=len(prompt) + 12)
    _centre_rows(w["log_softmax.mlp.layer0.weight"], words, _cohere_states(model, w, prompt, words), skip)
    _save(folder, w)


# ---------------------------------------------------------------- fireredasr2
#
# FireRedASR2-AED: Kaldi fbank (80 mels) with CMVN from cmvn.json, a conformer encoder (4x
# subsampling), and a transformer decoder decoded by beam search (3 beams by default). The
# decoder's positional table is a parameter (decoder.positional_encoding.pe), saved with the
# weights; the output layer has no bias. dict.txt maps ids to pieces (train_bpe1000.model is
# loaded beside it but not used to decode). sanitize transposes every conformer conv weight and
# the subsampling's Conv2d weights from PyTorch's layout unconditionally.
#
# The decoder is conditioned as Whisper's: dimension 0 of the final LayerNorm's output is a
# constant (weight 0, bias 16) that the output rows read as their offset; dimensions 1..15 carry
# the input token (the head does not read them), 16..30 are what the head reads, 31 a clock that
# only the positional table writes and only <eos> reads.

FIRERED_SPECIALS = ["<blank>", "<unk>", "<pad>", "<sos>", "<eos>"]


def _firered_decoder(w: Dict[str, object], words: List[int], eos: int, width: int, layers: int,
                     end_position: int) -> List[int]:
    import numpy as np

    bias_scale, ident, clock = 16.0, width // 2, width - 1
    read = list(range(ident, clock))
    E = w["decoder.tgt_word_emb.weight"]
    E[:] = 0.0
    E[:, 1:ident] = _normal((E.shape[0], ident - 1), 1.0 / np.sqrt(width))  # scaled by sqrt(width) in use
    W = w["decoder.tgt_word_prj.weight"]
    W[:] = 0.0
    W[:, 0] = MUTE / bias_scale
    W[np.ix_(words, read)] = _normal((len(words), len(read)))
    W[words, 0] = 0.0
    pe = w["decoder.positional_encoding.pe"]
    pe[:] = 0.0
    pe[0, :, ident:clock] = _normal((pe.shape[1], clock - ident), 0.5)
    pe[0, :, clock] = 2.0 * np.tanh((np.arange(pe.shape[1]) - end_position) / 2.0)
    for i in range(layers):
        for part in ("self_attn.fc", "cross_attn.fc", "mlp.w_2"):
            w[f"decoder.layer_stack.{i}.{part}.weight"][[0, clock]] = 0.0
            w[f"decoder.layer_stack.{i}.{part}.bias"][[0, clock]] = 0.0
    gain = np.ones(width, np.float32)
    gain[0] = 0.0
    shift = np.zeros(width, np.float32)
    shift[0] = bias_scale
    w["decoder.layer_norm_out.weight"], w["decoder.layer_norm_out.bias"] = gain, shift
    return [0, clock] + list(range(1, ident))


def _firered_states(model, w, sos: int, words: List[int], cmvn):
    import mlx.core as mx
    import numpy as np

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    dec = model.decoder
    out = []
    for n, audio in enumerate(_probe_clips()):
        feats = (model._extract_fbank(mx.array(audio)) - cmvn[0]) * cmvn[1]
        enc = model.encoder(feats[None])
        ys = mx.array([[sos] + [words[(5 * j + n) % len(words)] for j in range(12)]])
        x = dec.tgt_word_emb(ys) * dec.scale + dec.positional_encoding(ys.shape[1])
        causal = mx.expand_dims(mx.tril(mx.ones((ys.shape[1], ys.shape[1]))), axis=0)
        for layer in dec.layer_stack:
            x = layer(x, enc, causal)
        out.append(_np(dec.layer_norm_out(x))[0])
    return np.concatenate(out)


def build_fireredasr2(folder: Path) -> None:
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.fireredasr2.config import ModelConfig
    from mlx_audio.stt.models.fireredasr2.fireredasr2 import Model

    tokens = FIRERED_SPECIALS + ["\u2581" + word for word in WORDS]
    (folder / "dict.txt").write_text("".join(f"{t} {i}\n" for i, t in enumerate(tokens)), encoding="utf8")
    (folder / "train_bpe1000.model").write_bytes(_sentencepiece())
    width, layers = 32, 2
    cfg = {"model_type": "fireredasr2", "idim": 80, "odim": len(tokens), "d_model": width, "sos_id": 3, "eos_id": 4,
           "pad_id": 2, "blank_id": 0,
           "encoder": {"n_layers": layers, "n_head": 2, "d_model": width, "kernel_size": 9, "pe_maxlen": 5000},
           "decoder": {"n_layers": layers, "n_head": 2, "d_model": width, "pe_maxlen": 512}}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(cfg))
    feats = np.concatenate([_np(model._extract_fbank(mx.array(a))) for a in _probe_clips()])
    cmvn = feats.mean(0), 1.0 / (feats.std(0) + 1e-5)
    _write_json(folder / "cmvn.json", {"means": cmvn[0].tolist(), "istd": cmvn[1].tolist()})
    w = _params(model)
    w["encoder.input_preprocessor.out.weight"] *= SUBSAMPLING_GAIN
    for i in range(layers):  # what is heard reaches the text
        for part in ("w_vs", "fc"):
            w[f"decoder.layer_stack.{i}.cross_attn.{part}.weight"] *= 2.0
    words = list(range(len(FIRERED_SPECIALS), len(tokens)))
    skip = _firered_decoder(w, words, 4, width, layers, end_position=12)
    states = _firered_states(model, w, 3, words, (mx.array(cmvn[0]), mx.array(cmvn[1])))
    _centre_rows(w["decoder.tgt_word_prj.weight"], words, states, skip)
    # <eos> reads the clock: tens of logits below the words before the end position, above after.
    w["decoder.tgt_word_prj.weight"][4, width - 1] = 80.0 / np.ptp(states[:, width - 1])
    for key in list(w):  # sanitize turns these from PyTorch's layout into MLX's, whatever they hold
        if key.endswith(("pointwise_conv1.weight", "pointwise_conv2.weight", "depthwise_conv.weight")):
            w[key] = w[key].swapaxes(1, 2)
        elif "input_preprocessor.conv" in key and key.endswith("weight") and w[key].ndim == 4:
            w[key] = w[key].transpose(0, 3, 1, 2)
    _save(folder, w)


# ---------------------------------------------------------------- moonshine
#
# Moonshine: a conv stem on the raw 16 kHz waveform, a RoPE transformer encoder and decoder
# (no absolute positions), LayerNorms without bias, and an output layer without bias
# (tie_word_embeddings false here: a separate proj_out, which the config allows). With no bias
# and no position the decoder cannot be given a time to stop by its weights, so <eos> is muted
# and the recipe asks for max_tokens (the generate argument that bounds it); the text is the
# first 12 words. post_load_hook reads the tokenizer with AutoTokenizer; sanitize transposes
# every 3-d "conv...weight" from PyTorch's layout unconditionally.

MOONSHINE_TOKENS = 12


def _moonshine_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tok.save_pretrained(str(folder))
    return tok


def _moonshine_states(model, w, words: List[int]):
    import mlx.core as mx
    import numpy as np

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    out = []
    for n, audio in enumerate(_probe_clips()):
        enc = model.encoder(mx.array(audio))
        tokens = [1] + [words[(5 * j + n) % len(words)] for j in range(MOONSHINE_TOKENS)]
        hidden, _ = model.decoder(mx.array([tokens]), enc)
        out.append(_np(hidden)[0])
    return np.concatenate(out)


def build_moonshine(folder: Path) -> None:
    import numpy as np

    from mlx_audio.stt.models.moonshine.config import ModelConfig
    from mlx_audio.stt.models.moonshine.moonshine import Model

    tok = _moonshine_tokenizer(folder)
    width = 32
    cfg = {"model_type": "moonshine", "architectures": ["MoonshineForConditionalGeneration"], "vocab_size": len(tok),
           "hidden_size": width, "intermediate_size": 64, "encoder_num_hidden_layers": 2,
           "decoder_num_hidden_layers": 2, "encoder_num_attention_heads": 2, "decoder_num_attention_heads": 2,
           "encoder_hidden_act": "gelu", "decoder_hidden_act": "silu", "max_position_embeddings": 512,
           "partial_rotary_factor": 0.9, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
           "decoder_start_token_id": 1, "tie_word_embeddings": False}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(cfg))
    w = _params(model)
    # The token embedding in the first half of the dimensions, the head reading the second.
    half = width // 2
    w["decoder.embed_tokens.weight"][:, half:] = 0.0
    # With no position to vary the state, each step's token must move it: a stronger feed-forward
    # (else the decoder settles on one word), and a quieter pull of the audio summary, which is the
    # same at every step.
    for i in range(2):
        for part in ("fc1", "fc2"):
            w[f"decoder.layers.{i}.mlp.{part}.weight"] *= 3.0
        for part in ("v_proj", "o_proj"):
            w[f"decoder.layers.{i}.encoder_attn.{part}.weight"] *= 0.5
    words = list(range(3, len(tok)))
    head = w["proj_out.weight"]
    head[:] = 0.0
    head[np.ix_(words, range(half, width))] = _normal((len(words), width - half))
    _centre_rows(head, words, _moonshine_states(model, w, words), list(range(half)))
    for key in list(w):  # sanitize turns these from PyTorch's layout into MLX's
        if "conv" in key and key.endswith("weight") and w[key].ndim == 3:
            w[key] = w[key].swapaxes(1, 2)
    _save(folder, w)


# ---------------------------------------------------------------- nemotron_asr
#
# Nemotron ASR (streaming): a cache-aware FastConformer (causal subsampling, chunked-limited
# attention), a language prompt (one-hot concatenated to each frame, projected back by
# prompt_kernel), and a greedy RNN-T (no durations) whose vocabulary is a list in config.json;
# max_symbols (tokens one frame may emit) is 1 here, not the release's 10: a random joint that
# prefers a token at a frame keeps preferring it after emitting it, so it would fill every
# frame with ten copies.
# generate encodes in chunks (30 s by default) with the streaming caches. Weights under the
# module's own names (sanitize converts only the Hugging Face "nemotron_asr_streaming" layout).

NEMOTRON_PROMPTS = {"auto": 0, "en-US": 1, "de-DE": 2, "fr-FR": 3}


def _nemotron_frames(model, audio):
    """The prompted frames generate decodes: the cache-aware chunked encoding."""
    import mlx.core as mx

    from mlx_audio.stt.models.nemotron_asr.audio import log_mel_spectrogram
    from mlx_audio.stt.models.nemotron_asr.streaming import stream_encode

    mel = log_mel_spectrogram(audio, model.preprocessor_config)
    return mx.concatenate(list(stream_encode(model, mel, model.default_language)), axis=1)[0]


def build_nemotron_asr(folder: Path) -> None:
    from mlx_audio.stt.models.nemotron_asr.nemotron_asr import Model, ModelConfig

    vocabulary = _nemo_vocabulary()
    width, hidden = 32, 32
    cfg = {"model_type": "nemotron_asr",
           "target": "nemo.collections.asr.models.rnnt_bpe_models_prompt.EncDecRNNTBPEModelWithPrompt",
           "preprocessor": {"sample_rate": 16000, "features": 80, "n_fft": 512, "window_size": 0.025,
                            "window_stride": 0.01, "window": "hann", "preemph": 0.97, "dither": 0.0,
                            "normalize": "NA", "pad_to": 0, "pad_value": 0.0, "pad_mode": "reflect"},
           "encoder": {"feat_in": 80, "n_layers": 2, "d_model": width, "n_heads": 2, "ff_expansion_factor": 2,
                       "subsampling_factor": 8, "subsampling_conv_channels": 16, "conv_kernel_size": 9,
                       "causal_downsampling": True, "conv_context_size": "causal", "conv_norm_type": "layer_norm",
                       "self_attention_model": "rel_pos", "att_context_style": "chunked_limited",
                       "att_context_size": [[56, 13]], "pos_emb_max_len": 5000, "use_bias": False,
                       "xscaling": False},
           "prompt": {"num_prompts": len(NEMOTRON_PROMPTS), "prompt_hidden": 2 * width,
                      "prompt_dictionary": NEMOTRON_PROMPTS},
           "decoder": {"pred_hidden": hidden, "pred_rnn_layers": 1, "vocab_size": len(vocabulary),
                       "blank_as_pad": True},
           "joint": {"joint_hidden": hidden, "activation": "relu", "encoder_hidden": width, "pred_hidden": hidden,
                     "num_classes": len(vocabulary)},
           "vocabulary": vocabulary, "default_language": "auto", "default_att_context_size": [56, 13],
           "max_symbols": 1}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    w = _params(model)
    w["encoder.pre_encode.out.weight"] *= SUBSAMPLING_GAIN
    # The joint hears the frame more than the last token (else one token fills every frame).
    w["joint.enc.weight"] *= 4.0
    _joint_output(w, "joint.joint_net.2", _joint_hidden(model, w, _nemotron_frames), len(vocabulary), blank=8.0,
                  token_std=4.0, durations=[], blank_jitter=0.25)
    _save(folder, w)


# ---------------------------------------------------------------- phonon2
#
# Phonon-2/2.5: Parakeet TDT whose every encoder projection is a packed five-value layer (two
# 2-bit planes of uint32 codes, 16 to a word, and float16 row palettes lo/hi, dequantised as
# lo*(base-1) + (hi-lo)*(residual-1)); the published releases are compressed archives that
# prepare_model_path unpacks into an ordinary checkpoint: config.json with model_type "phonon2",
# the Parakeet sections and `phonon2_modules` (each packed layer's name and [outputs, inputs]),
# and model.safetensors. That unpacked form is what is written here. The packed layers need
# inputs divisible by 128, so the encoder is 128 wide (one layer); load_weights insists on every
# parameter (strict), uint32 codes and float16 palettes.


def _packed_codes(rows: int, inputs: int):
    """Random five-value codes: each 2-bit code in {0, 1, 2}, 16 to a uint32."""
    import numpy as np

    import mlx.core as mx

    codes = np.array(mx.random.randint(0, 3, (rows, inputs))).astype(np.uint64)
    codes = codes.reshape(rows, inputs // 16, 16) << (2 * np.arange(16, dtype=np.uint64))
    return codes.sum(-1).astype(np.uint32)


def build_phonon2(folder: Path) -> None:
    import numpy as np

    import mlx.core as mx
    from mlx_audio.stt.models.phonon2 import Model, ModelConfig
    from mlx_audio.stt.models.phonon2.packed import ENCODER_SUFFIXES

    width = 128
    cfg = _parakeet_config()
    cfg["encoder"] = _conformer(80, width, 1)
    cfg["encoder"]["ff_expansion_factor"] = 1
    cfg["model_defaults"]["enc_hidden"] = width
    cfg["joint"]["jointnet"]["encoder_hidden"] = width
    modules = []
    for suffix in ENCODER_SUFFIXES:
        outputs = 2 * width if suffix == "conv.pointwise_conv1" else width
        modules.append({"name": f"encoder.layers.0.{suffix}", "shape": [outputs, width]})
    cfg = {"model_type": "phonon2", "phonon2_modules": modules, "languages": ["en"],
           **{k: cfg[k] for k in ("preprocessor", "encoder", "decoder", "joint", "decoding")}}
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    w = _params(model)
    packed = set()
    for row in modules:
        outputs, inputs = row["shape"]
        name = row["name"]
        w[name + ".base_q"] = _packed_codes(outputs, inputs)
        w[name + ".residual_q"] = _packed_codes(outputs, inputs)
        lo = np.abs(_normal((outputs,), 1.0 / np.sqrt(inputs))) + 0.5 / np.sqrt(inputs)
        w[name + ".row_lo"] = lo.astype(np.float16)
        w[name + ".row_hi"] = (lo * 1.5).astype(np.float16)
        packed.update(name + p for p in (".base_q", ".residual_q", ".row_lo", ".row_hi"))
    w["encoder.pre_encode.out.weight"] *= SUBSAMPLING_GAIN
    arrays = lambda: [(k, mx.array(v)) for k, v in w.items()]  # noqa: E731
    model.load_weights(arrays())  # Phonon-2's own: checks dtypes, materialises the packed layers
    n = len(cfg["joint"]["vocabulary"])
    hidden = _joint_hidden(_Loaded(model), w, _parakeet_frames)
    _joint_output(w, "joint.joint_net.2", hidden, n, blank=8.0, token_std=4.0,
                  durations=[-6.0, 1.0, 1.0, 0.0, -2.0])
    _save(folder, w, keep=packed)


class _Loaded:
    """A model whose weights are already in place: _joint_hidden's load is skipped (Phonon-2's
    load_weights refuses float32 copies of its packed codes)."""

    def __init__(self, model):
        self._model = model

    def load_weights(self, weights):
        pass

    def __getattr__(self, name):
        return getattr(self._model, name)


# ---------------------------------------------------------------- granite_speech_nar
#
# Granite Speech NAR: a conformer encoder with a character CTC head for self-conditioning
# (its blank, index 0, weighs the pooling), a BPE CTC head over 4-frame pools giving a first
# hypothesis, a Q-Former projector turning the encoder's chosen layers into audio embeddings,
# and a bidirectional Granite editor (tied embeddings) that reads [audio | hypothesis with blank
# slots] and whose per-slot argmax, CTC-collapsed, is the text. All in one pass, no decoding
# loop. The tokenizer is read with AutoTokenizer; config.json has every field in code (no
# defaults). The editor is left as drawn: with tied embeddings each slot mostly keeps its own
# token, so the text follows the hypothesis, which the BPE head makes from the audio.

GRANITE_NAR_SPECIALS = ["<unk>", "<|end_of_text|>", "<blank>"]


def _granite_nar_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(GRANITE_NAR_SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<|end_of_text|>",
                                  eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
                                  additional_special_tokens=["<blank>"])
    tok.save_pretrained(str(folder))
    return tok


def _granite_nar_config(vocab: int) -> dict:
    width = 32
    return {
        "model_type": "granite_speech_nar", "blank_token_id": 2, "scale_projected_embeddings": True,
        "min_edit_sequence_length": 8, "tie_word_embeddings": True, "encoder_layer_indices": [1, -1],
        "encoder_config": {"num_layers": 2, "hidden_dim": width, "num_heads": 2, "dim_head": 16, "input_dim": 160,
                           "output_dim": 8, "bpe_output_dim": vocab, "bpe_pooling_window": 4, "conv_kernel_size": 9,
                           "conv_expansion_factor": 2, "feedforward_mult": 2, "max_pos_emb": 64, "context_size": 32,
                           "self_conditioning_layer": 1, "blank_token_id": 0, "dropout": 0.0, "pred_dropout": 0.0,
                           "initializer_range": 0.02},
        "projector_config": {"num_layers": 1, "num_encoder_layers": 2, "hidden_size": width, "num_heads": 2,
                             "block_size": 15, "downsample_rate": 5, "encoder_dim": width, "llm_dim": width,
                             "mlp_ratio": 2, "mlp_bias": True, "attn_bias": True, "dropout_prob": 0.0,
                             "layernorm_eps": 1e-6},
        "text_config": {"hidden_size": width, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": vocab,
                        "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                        "rope_parameters": {"rope_theta": 10000.0},
                        "tie_word_embeddings": True, "attention_multiplier": 0.25, "embedding_multiplier": 12.0,
                        "logits_scaling": 8.0, "residual_multiplier": 0.22, "bos_token_id": 1, "eos_token_id": 1,
                        "pad_token_id": 1},
    }


def _granite_nar_pools(model, w):
    """The pooled encoder states the BPE head reads, over the probe clips."""
    import mlx.core as mx
    import numpy as np

    from mlx_audio.stt.models.granite_speech_nar.granite_speech_nar import _compute_features

    model.load_weights([(k, mx.array(v)) for k, v in w.items()])
    head, seen = model.encoder.out_bpe, []

    class Record:
        def __call__(self, x):
            seen.append(_np(x)[0])
            return head(x)

    model.encoder.out_bpe = Record()
    for audio in _probe_clips():
        model.encoder(_compute_features(mx.array(audio))[None])
    model.encoder.out_bpe = head
    return np.concatenate(seen)


def build_granite_speech_nar(folder: Path) -> None:
    import numpy as np

    from mlx_audio.stt.models.granite_speech_nar.config import ModelConfig
    from mlx_audio.stt.models.granite_speech_nar.granite_speech_nar import Model

    tok = _granite_nar_tokenizer(folder)
    cfg = _granite_nar_config(len(tok))
    _write_json(folder / "config.json", cfg)
    model = Model(ModelConfig.from_dict(cfg))
    w = _params(model)
    words = list(range(len(GRANITE_NAR_SPECIALS), len(tok)))
    pools = _granite_nar_pools(model, w)
    W, b = w["encoder.out_bpe.weight"], w["encoder.out_bpe.bias"]
    _ctc_head(W, b, pools, words, blank=2, token_std=6.0, blank_offset=6.0)
    # The BPE logits are cast to bfloat16 (the features' dtype) before their argmax: lowered so a
    # frame's leading logits sit near zero, where bfloat16 still tells them apart, not near 10.
    keep = words + [2]
    b[keep] -= float(np.median((pools @ W[keep].T + b[keep]).max(-1)))
    _save(folder, w)


# ---------------------------------------------------------------- the matrix's table

RECIPES: Dict[str, AudioRecipe] = {
    "whisper": AudioRecipe(
        "whisper", "stt", build_whisper, {}, CLIPS,
        note="large-v3 layout (128 mels, 51866 tokens), width 32; language detected (English)"),
    "parakeet": AudioRecipe(
        "parakeet", "stt", build_parakeet, {}, CLIPS,
        note="TDT (durations 0-4), conformer width 32, 2 layers; vocabulary in config.json"),
    "mms": AudioRecipe(
        "mms", "stt", build_mms, {}, CLIPS,
        note="wav2vec2 CTC over letters, width 32, 2 layers; Wav2Vec2Processor files"),
    "granite_speech5_ctc": AudioRecipe(
        "granite_speech5_ctc", "stt", build_granite_speech5_ctc, {}, CLIPS,
        note="conformer CTC width 32, 2 layers (both subsampling: 80 ms frames); word-level tokenizer.json"),
    "sensevoice": AudioRecipe(
        "sensevoice", "stt", build_sensevoice, {}, CLIPS,
        note="SAN-M CTC width 32, 2+1 blocks; am.mvn from probe audio; 59-row SentencePiece (rich labels unknown)"),
    "canary": AudioRecipe(
        "canary", "stt", build_canary, {}, CLIPS,
        note="FastConformer width 32 x2 + transformer decoder x2; SentencePiece with Canary's prompt tokens"),
    "cohere_asr": AudioRecipe(
        "cohere_asr", "stt", build_cohere_asr, {}, CLIPS,
        note="conformer width 32 x2 + transformer decoder x2; SentencePiece + tokenizer_config special tokens"),
    "fireredasr2": AudioRecipe(
        "fireredasr2", "stt", build_fireredasr2, {}, CLIPS,
        note="conformer width 32 x2 + transformer decoder x2, beam search 3; dict.txt, cmvn.json"),
    "moonshine": AudioRecipe(
        "moonshine", "stt", build_moonshine, {"max_tokens": MOONSHINE_TOKENS}, CLIPS,
        note="width 32, 2+2 layers, untied head; no bias or position to end on, so max_tokens bounds it"),
    "nemotron_asr": AudioRecipe(
        "nemotron_asr", "stt", build_nemotron_asr, {}, CLIPS,
        note="cache-aware FastConformer width 32 x2, 4 language prompts, greedy RNN-T; vocabulary in config.json"),
    "phonon2": AudioRecipe(
        "phonon2", "stt", build_phonon2, {}, CLIPS,
        note="Parakeet TDT with packed five-value encoder layers (width 128, the packing's minimum), unpacked form"),
    "granite_speech_nar": AudioRecipe(
        "granite_speech_nar", "stt", build_granite_speech_nar, {}, CLIPS,
        note="conformer CTC hypothesis + Q-Former + 1-layer bidirectional editor, width 32; word-level tokenizer"),
}

NOT_BUILT: Dict[str, str] = {
    "nemo": ("not a model family: the package holds only the alignment helpers Parakeet, Canary and "
             "Nemotron share (nemo/alignment.py), no Model for load_model to build"),
    "wav2vec": ("no transcription: its Model is Wav2Vec2Model, the bare encoder (sanitize drops lm_head.*), "
                "with no generate, so generate_transcription cannot call it; its CTC use is the mms family"),
    "lasr_ctc": ("no transcription: its Model (LasrForCTC) has no generate, and its decode() builds "
                 "STTOutput(text='', tokens=...), a field STTOutput does not have (TypeError), without ever "
                 "detokenising; generate_transcription cannot call it"),
    "mega_asr": ("its generate takes only (audio, **kwargs), and generate_transcription passes a model only the "
                 "keyword arguments its signature names, so no option (max_tokens, language, system_prompt) ever "
                 "reaches it: built from the LLM-decoder recipes' tiny Qwen3-ASR (stt_b) with model_type "
                 "'mega_asr', it loads and runs but decodes Qwen3-ASR's default 8192 tokens per clip (13.5 s here, "
                 "text to the limit), and a Qwen3 decoder (RoPE only, RMSNorm without bias, tied head) has no "
                 "weight that can place an end token at a chosen step"),
    "phonon": ("Phonon-1 is Qwen3-ASR whose decoder linears are packed five-value layers (packed_manifest.json "
               "beside the weights, status PASS, group size 128, 2 bits): the decoder must be 128 wide or more "
               "(the LLM-decoder recipes' tiny Qwen3-ASR is 32) and its codes written in the packed layout; not "
               "made in this pass. Its releases are hub archives that prepare_model_path unpacks"),
}
