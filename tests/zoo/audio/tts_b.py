"""Tiny random-weight models of mlx-audio's text-to-speech families M-Z, built with the families'
own classes (the tts half of the audio matrix beside tts_a.py).

Each recipe writes, at a few dozen channels, what its family's loader reads: config.json, the
weights in a layout its `sanitize` gives back unchanged (`_fit` checks every tensor; some
sanitizers guess layouts from shapes, which fixes a few sizes), a tokenizer trained here (a
byte-level BPE, a SentencePiece model, a byte-level tekken), voices, and the codec or vocoder
folder it loads beside the model. Seeded by the builder; conditioned so that the audio is a
deterministic, audible function of the text:
- output heads redrawn so greedy margins are wide, and the stop rows silenced: a random model
  would stop at a random step, so a small `max_tokens` in the recipe's `generate` sets the
  length, with sampling off there (temperature 0 / do_sample False);
- random vocoders redrawn at unit gain with their biases at zero (a bias adds the same pattern
  to every frame), then scaled to an RMS near 0.1;
- where a family draws noise from MLX's unseeded global generator (diffusion and flow heads),
  a config value or a zero matrix keeps it out of the result (VibeVoice, Voxtral, Pocket TTS);
  VoxCPM's noise cannot be kept out, see NOT_BUILT.
A family whose loader fetches a codec or tokenizer from the hub by a name fixed in code is not
built here (NOT_BUILT says which and where).
"""

import json
from pathlib import Path
from typing import Dict

from zoo.audio.recipe import AudioRecipe

# Two short texts: different words and lengths, so the two waveforms differ in content.
TEXTS = ("Hello there.", "The quick brown fox jumps over the lazy dog.")
CORPUS = [
    "Hello there. The quick brown fox jumps over the lazy dog.",
    "A different sentence, longer. How are you today? One two three four five.",
    "system user assistant: the cat sat on the mat while the sun was shining.",
]
LOGIT_STD = 3.0  # greedy's margins between codes are then wide


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _flat(module) -> Dict[str, object]:
    from mlx.utils import tree_flatten

    return dict(tree_flatten(module.parameters()))


def _layouts(w):
    """`w` and its axis permutations: the layouts a sanitize may expect (PyTorch's conv
    weights are stored (out, in, k), MLX's (out, k, in); transposed convs (in, out, k))."""
    import itertools

    import mlx.core as mx

    yield w
    for perm in itertools.permutations(range(w.ndim)):
        if list(perm) != list(range(w.ndim)) and w.ndim >= 3:
            yield mx.transpose(w, perm)


def _fit(sanitize, weights: Dict[str, object]) -> Dict[str, object]:
    """`weights` (the model's own keys and layout) stored so that the family's `sanitize`,
    which guesses layouts from shapes, gives each one back unchanged."""
    import mlx.core as mx

    out = {}
    for key, w in weights.items():
        for cand in _layouts(w):
            got = sanitize({key: cand})
            # compared in the stored dtype: some sanitizers cast (Soprano's decoder to float32)
            if key in got and got[key].shape == w.shape and bool(mx.array_equal(got[key].astype(w.dtype), w)):
                out[key] = cand
                break
        else:
            raise ValueError(f"no layout of {key} {tuple(w.shape)} survives sanitize")
    return out


def _head(shape, std: float = LOGIT_STD):
    """A fresh output matrix (rows: classes) whose logits over a unit-RMS hidden state have a
    standard deviation near `std`."""
    import mlx.core as mx

    return mx.random.normal(shape) * (std / shape[-1] ** 0.5)


def _damp_rows(head, rows, keep: float = 0.0):
    """`head` with the rows of `rows` (token ids) scaled by `keep`: at 0 greedy never picks
    them (a stop token, say) unless every other logit is negative."""
    import mlx.core as mx

    mask = mx.zeros((head.shape[0], 1), dtype=mx.bool_)
    mask[mx.array(list(rows))] = True
    return mx.where(mask, head * keep, head)


def _unbiased(module, gain: Dict[str, float] = None):
    """Zero `module`'s biases and draw its parameters named in `gain` (by the last part of
    their key) as normal noise of that scale. A random vocoder's biases add the same pattern
    to every frame, which then dominates the waveform whatever the codes; layer scales the
    library starts near zero (ConvNeXt's gamma, 1e-6) would leave their blocks out."""
    import mlx.core as mx

    weights = {}
    for key, w in _flat(module).items():
        name = key.rsplit(".", 1)[-1]
        if name == "bias":
            w = mx.zeros_like(w)
        elif gain and name in gain:
            w = mx.random.normal(w.shape) * gain[name]
        weights[key] = w
    module.load_weights(list(weights.items()))


def _redrawn(weights: Dict[str, object], gain: float = 1.0) -> Dict[str, object]:
    """Conv (or linear) weights drawn anew as normal noise of variance gain / fan-in, the
    scale at which a stack of them neither fades nor blows up."""
    import math

    import mlx.core as mx

    return {k: mx.random.normal(w.shape) * (gain / math.prod(w.shape[1:])) ** 0.5 for k, w in weights.items()}


def _vocoder(module, last, run, gain: Dict[str, float] = None):
    """Condition a random vocoder `module` so its waveform follows its input: convs redrawn at
    unit gain, biases at zero, the parameters named in `gain` redrawn at that scale (layer
    scales the library starts near zero), then `last` scaled so that `run()` is audible."""
    weights = _flat(module)
    module.load_weights(list(_redrawn({k: v for k, v in weights.items() if v.ndim == 3}).items()), strict=False)
    _unbiased(module, gain)
    _loudness(last, run)


def _loudness(layer, run, rms: float = 0.1, passes: int = 2):
    """Scale the last layer (`layer`, weight and bias) so that `run()`, the waveform of some
    probe codes, has about `rms`: at the library's init a tiny vocoder's output is near silence."""
    import mlx.core as mx

    for _ in range(passes):  # twice: a bias or a clip makes one step inexact
        got = float(mx.sqrt(mx.mean(mx.square(run().astype(mx.float32)))).item())
        if "weight_g" in layer:  # weight-normalised: its gain is weight_g
            layer.weight_g = layer.weight_g * (rms / got)
        else:
            layer.weight = layer.weight * (rms / got)
        if "bias" in layer:
            layer.bias = layer.bias * (rms / got)


def _scaled_layers(weights: Dict[str, object], prefix: str, gain: float = 2.0) -> Dict[str, object]:
    """`weights` with the matrices under `prefix` (a transformer's layers) scaled by `gain`. At
    the library's init the text reaches the audio positions of a long prompt only faintly, and
    greedy codes come out the same for any text; scaled up they differ."""
    return {k: v * gain if k.startswith(prefix) and v.ndim == 2 else v for k, v in weights.items()}


def _save(path: Path, weights: Dict[str, object]):
    import mlx.core as mx

    path.parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path), weights)


def _write_json(path: Path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1))


def _bpe(folder: Path, specials, vocab: int = 320, corpus=CORPUS, **named):
    """A byte-level BPE trained here (specials first in its vocabulary), saved into `folder`
    as transformers saves a fast tokenizer; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus) * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=list(specials), **named)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return fast


# ---------------------------------------------------------------------------------------------
# Qwen3-TTS: a CustomVoice talker (two preset speakers) over a 12.5 Hz speech-token decoder.

_Q3_CODES = 64  # codebook size; the talker's vocabulary adds 1024 control ids above it
_Q3_GROUPS = 4  # code groups per frame (16 in the real model)


def _qwen3_tts_config(text_vocab: int) -> dict:
    c = _Q3_CODES
    code_predictor = dict(vocab_size=c, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          num_code_groups=_Q3_GROUPS)
    talker = dict(
        code_predictor_config=code_predictor, vocab_size=c + 1024, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        # the three MRoPE sections split head_dim / 2 = 8 frequencies (24/20/20 of 64 in the real one)
        rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
        num_code_groups=_Q3_GROUPS, text_hidden_size=32, text_vocab_size=text_vocab + 3,
        codec_eos_token_id=c, codec_think_id=c + 1, codec_nothink_id=c + 2, codec_think_bos_id=c + 3,
        codec_think_eos_id=c + 4, codec_pad_id=c + 5, codec_bos_id=c + 6,
        codec_language_id={"english": c + 10, "chinese": c + 11},
        spk_id={"ryan": c + 20, "vivian": c + 21}, spk_is_dialect={"ryan": False, "vivian": False},
    )
    # The tts bos/eos/pad ids only index the text embedding: the three rows past the tokenizer's.
    return dict(model_type="qwen3_tts", tts_model_type="custom_voice", tts_model_size="1b7",
                talker_config=talker, tts_pad_token_id=text_vocab, tts_bos_token_id=text_vocab + 1,
                tts_eos_token_id=text_vocab + 2, sample_rate=24000)


def _qwen3_speech_tokenizer(folder: Path):
    """The 12 Hz speech-token decoder at a few channels, upsampling 1920 samples a frame as the
    real one (12.5 frames a second at 24 kHz). All of it in the latent upsampling stages
    (8 * 8 * 30) and none in the vocoder blocks (8, 5, 4, 3 in the real one): the blocks'
    dilated convs are slow on this CPU at 24 kHz, and their 1x1 convs would need more than 64
    channels for sanitize to tell their layout from their sides."""
    import mlx.core as mx
    from mlx_audio.tts.models.qwen3_tts.config import Qwen3TTSTokenizerConfig, Qwen3TTSTokenizerDecoderConfig
    from mlx_audio.tts.models.qwen3_tts.speech_tokenizer import Qwen3TTSSpeechTokenizer

    # codebook_dim past 128: the codebooks' 1x1 projections have a side above 64, from which
    # sanitize tells their layout; latent_dim 32 above every upsampling factor, likewise.
    decoder = dict(latent_dim=32, codebook_dim=160, codebook_size=_Q3_CODES, decoder_dim=16, upsample_rates=[],
                   upsampling_ratios=[8, 8, 30], hidden_size=16, intermediate_size=32, head_dim=8,
                   num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1, num_quantizers=_Q3_GROUPS,
                   num_semantic_quantizers=1, vector_quantization_hidden_dimension=16)
    config = dict(decoder_config=decoder, encoder_valid_num_quantizers=_Q3_GROUPS, input_sample_rate=24000,
                  output_sample_rate=24000, decode_upsample_rate=1920, encode_downsample_rate=1920)
    codec = Qwen3TTSSpeechTokenizer(Qwen3TTSTokenizerConfig(decoder_config=Qwen3TTSTokenizerDecoderConfig(**decoder)))
    _unbiased(codec, gain={"gamma": 0.5})
    probe = mx.random.randint(0, _Q3_CODES, (1, _Q3_GROUPS, 12))
    _loudness(codec.decoder.decoder[-1].conv, lambda: codec.decoder(probe))
    _write_json(folder / "speech_tokenizer" / "config.json", config)
    _save(folder / "speech_tokenizer" / "model.safetensors", _fit(Qwen3TTSSpeechTokenizer.sanitize, _flat(codec)))


def _build_qwen3_tts(folder: Path):
    from mlx_audio.tts.models.qwen3_tts import Model, ModelConfig

    tok = _bpe(folder, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>",
               pad_token="<|endoftext|>")
    config = _qwen3_tts_config(len(tok))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    weights = _flat(model)
    # the end-of-audio row at zero: never the greedy pick, so max_tokens sets the length
    weights["talker.codec_head.weight"] = _damp_rows(_head(weights["talker.codec_head.weight"].shape),
                                                     [config["talker_config"]["codec_eos_token_id"]])
    for i in range(_Q3_GROUPS - 1):
        key = f"talker.code_predictor.lm_head.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _qwen3_speech_tokenizer(folder)


# ---------------------------------------------------------------------------------------------
# Soprano: a Qwen3 LM whose hidden states a Vocos decoder turns into audio.


def _build_soprano(folder: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.soprano import Model, ModelConfig

    tok = _bpe(folder, ["[STOP]", "[TEXT]", "[START]"], pad_token="[STOP]")
    # The decoder is not in config.json: its size is fixed in code (8 ConvNeXt layers of 512
    # channels, ISTFT with n_fft 2048, hop 512, 4 frames a token) for any folder not named
    # soprano-1.1, and the loader does not read a decoder_config.
    config = dict(model_type="soprano", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                  vocab_size=len(tok), max_position_embeddings=4096, rope_theta=10000.0,
                  tie_word_embeddings=False, sample_rate=32000)
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict({**config, "model_path": str(folder)}))
    _soprano_loudness(model.decoder)
    weights = _flat(model)
    head = _head(weights["language_model.lm_head.weight"].shape)
    weights["language_model.lm_head.weight"] = _damp_rows(head, [tok.pad_token_id])
    # the decoder (14M parameters) stored in float16, half the file: its sanitize casts it back
    weights = {k: v.astype(mx.float16) if k.startswith("decoder.") else v for k, v in weights.items()}
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))


def _soprano_loudness(decoder, rms: float = 0.1):
    """Raise the ISTFT head's log-magnitude biases so a probe's waveform has about `rms`: the
    head's magnitudes are exp() of its first n_fft/2+1 outputs, and the ISTFT is linear in them."""
    import math

    import mlx.core as mx

    probe = mx.random.normal((1, 6, decoder.decoder_initial_channels))
    bins = decoder.n_fft // 2 + 1
    for _ in range(2):  # twice: the head clips large magnitudes
        got = float(mx.sqrt(mx.mean(mx.square(decoder(probe)))).item())
        shift = mx.concatenate([mx.full((bins,), math.log(rms / got)), mx.zeros((bins,))])
        decoder.head.out.bias = decoder.head.out.bias + shift


# ---------------------------------------------------------------------------------------------
# Pocket TTS (Kyutai / Gradium Phonon): a flow LM over continuous latents, a Mimi-style decoder.

_POCKET_VOICES = ("alba", "marius")


def _pocket_config(vocab: int) -> dict:
    flow_lm = dict(dtype="float32", flow={"dim": 32, "depth": 1}, ldim=16,
                   transformer={"hidden_scale": 2.0, "max_period": 10000, "d_model": 32, "num_heads": 2,
                                "num_layers": 2},
                   lookup_table={"dim": 32, "n_bins": vocab, "tokenizer": "huggingface",
                                 "tokenizer_path": "tokenizer.json"})
    # The real Mimi's layout at 4-32 channels: SEANet ratios 8*6*5*4 (25 Hz), upsampled 2x from
    # the 12.5 Hz latents.
    seanet = dict(dimension=32, channels=1, n_filters=4, n_residual_layers=1, ratios=[8, 6, 5, 4], kernel_size=7,
                  residual_kernel_size=3, last_kernel_size=3, dilation_base=2, pad_mode="constant", compress=2)
    mimi = dict(dtype="float32", sample_rate=24000, channels=1, frame_rate=12.5, seanet=seanet,
                transformer={"d_model": 32, "input_dimension": 32, "output_dimensions": [32], "num_heads": 2,
                             "num_layers": 1, "layer_scale": 0.01, "context": 250, "dim_feedforward": 64,
                             "max_period": 10000.0},
                quantizer={"dimension": 16, "output_dimension": 32})
    # eos_threshold out of reach: a random EOS head would fire at once or never; the library's
    # own bound then sets the length, (words + 2) seconds of 12.5 Hz frames.
    return dict(model_type="pocket_tts", flow_lm=flow_lm, mimi=mimi, temp=0.7, lsd_decode_steps=1,
                eos_threshold=1e9)


def _build_pocket_tts(folder: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.pocket_tts import Model, ModelConfig

    tok = _bpe(folder, ["<unk>"])
    config = _pocket_config(len(tok))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict({**config, "model_path": str(folder)}))
    # Without the audio encoder (as the "without voice cloning" checkpoints ship): sanitize
    # drops it when no mimi.encoder.* key is stored, and voices come from voices/*.safetensors.
    # The flow net's biases make every latent the same offset, which then is all one hears.
    _unbiased(model.flow_lm.flow_net)
    dropped = ("mimi.encoder.", "mimi.encoder_transformer.", "mimi.downsample.")
    weights = {k: v for k, v in _flat(model).items() if not k.startswith(dropped)}
    weights["speaker_proj_weight"] = _head(weights["speaker_proj_weight"].shape, 1.0)
    # Mimi's convs start at uniform(+-1 / fan_in): ten layers of them leave 1e-11 of the signal
    weights.update(_redrawn({k: v for k, v in weights.items() if k.startswith("mimi.") and v.ndim == 3}))
    model.load_weights(list(weights.items()), strict=False)
    probe = mx.random.normal((1, 32, 6))
    _loudness(model.mimi.decoder.final_conv1d.conv.conv, lambda: model.mimi.decode_from_latent(probe))
    weights.update({k: v for k, v in _flat(model).items() if k.startswith("mimi.decoder.final_conv1d.")})
    _save(folder / "model.safetensors", weights)
    for name in _POCKET_VOICES:  # a voice is the flow LM's prompt: [1, frames, d_model]
        _save(folder / "voices" / f"{name}.safetensors", {"audio_prompt": mx.random.normal((1, 4, 32))})


# ---------------------------------------------------------------------------------------------
# VibeVoice (streaming, "Realtime"): split Qwen2 LM, a diffusion head over acoustic latents, a
# causal VAE decoder; voices are cached LM states under voices/.

_VIBE_VOICES = ("en-carter_man", "en-emma_woman")
_VIBE_HIDDEN, _VIBE_LATENT = 32, 8


def _final_folder(folder: Path) -> Path:
    """Where the builder puts `folder` once built: it builds into "<name>.partial-<pid>" and
    renames (models.building). For loaders that read an absolute path from a file."""
    return folder.with_name(folder.name.split(".partial-")[0])


def _vibevoice_config(vocab: int) -> dict:
    decoder = dict(hidden_size=_VIBE_HIDDEN, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                   head_dim=16, num_hidden_layers=2, vocab_size=vocab, max_position_embeddings=4096)
    # The real VAE's 3200x upsampling (8*5*5*4*2*2: 7.5 latents a second at 24 kHz) at 2-128 channels.
    acoustic = dict(vae_dim=_VIBE_LATENT, encoder_ratios=[8, 5, 5, 4, 2, 2], decoder_n_filters=2,
                    decoder_depths="1-1-1-1-1-1-1", encoder_n_filters=2, encoder_depths="1-1-1-1-1-1-1")
    # prediction_type "sample" (v_prediction in the real one): the head predicts the latent
    # itself, which, with its noisy-input projection at zero (_build_vibevoice), leaves the
    # unseeded starting noise out of the result.
    diffusion = dict(hidden_size=_VIBE_HIDDEN, head_layers=1, head_ffn_ratio=2.0, latent_size=_VIBE_LATENT,
                     speech_vae_dim=_VIBE_LATENT, prediction_type="sample", ddpm_num_inference_steps=2)
    return dict(model_type="vibevoice_streaming", decoder_config=decoder, acoustic_tokenizer_config=acoustic,
                diffusion_head_config=diffusion, acoustic_vae_dim=_VIBE_LATENT, tts_backbone_num_hidden_layers=1,
                sample_rate=24000)


def _vibevoice_voice(model) -> Dict[str, object]:
    """A voice cache as the library reads it: LM hidden states and keys/values per layer,
    (batch, kv heads, positions, head dim), for the text LM, the TTS LM and its negative."""
    import mlx.core as mx

    frames = 4
    voice = {name: mx.random.normal((1, frames, _VIBE_HIDDEN)) for name in
             ("lm_hidden", "tts_lm_hidden", "neg_tts_lm_hidden")}
    layers = {"lm": len(model.language_model.layers), "tts_lm": len(model.tts_language_model.layers),
              "neg_tts_lm": len(model.tts_language_model.layers)}
    for prefix, count in layers.items():
        for i in range(count):
            for part in ("key", "value"):
                voice[f"{prefix}_{part}_{i}"] = mx.random.normal((1, 1, frames, 16))
    return voice


def _build_vibevoice(folder: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.vibevoice import Model, ModelConfig

    tok = _bpe(folder, ["<|endoftext|>"])
    # The tokenizer is read from the path preprocessor_config.json names (a hub id otherwise).
    _write_json(folder / "preprocessor_config.json",
                {"language_model_pretrained_name": str(_final_folder(folder))})
    config = _vibevoice_config(len(tok))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    # the condition (the TTS LM's state) up against the timestep embedding, which is the same
    # for every latent
    model.prediction_head.cond_proj.weight = model.prediction_head.cond_proj.weight * 4.0
    probe = mx.random.normal((1, 6, _VIBE_LATENT))
    _vocoder(model.acoustic_tokenizer.decoder, model.acoustic_tokenizer.decoder.head.conv.conv,
             lambda: model.acoustic_tokenizer.decode(probe), gain={"gamma": 0.5, "ffn_gamma": 0.5})
    weights = _flat(model)
    weights["prediction_head.noisy_images_proj.weight"] = mx.zeros_like(
        weights["prediction_head.noisy_images_proj.weight"])
    # the end-of-speech classifier far below 0.5: max_tokens sets the length
    weights["tts_eos_classifier.fc2.bias"] = mx.full(weights["tts_eos_classifier.fc2.bias"].shape, -30.0)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    for name in _VIBE_VOICES:
        _save(folder / "voices" / f"{name}.safetensors", _vibevoice_voice(model))


# ---------------------------------------------------------------------------------------------
# Spark-TTS: a Qwen2 LM writes BiCodec tokens as text (<|bicodec_global_N|>, then
# <|bicodec_semantic_N|>), which the BiCodec decoder turns into 16 kHz audio.

_SPARK_SEMANTIC = 64  # semantic codebook size: <|bicodec_semantic_0..63|>
_SPARK_WIDTH = 16  # BiCodec's feature width (1024 in the real one)
_SPARK_D = 32  # the speaker vector (d-vector) width


def _spark_specials():
    """The tokens Spark's prompts and outputs use. One global token only: the speaker encoder
    here reads a single one (token_num 1), and generation must write exactly that many."""
    task = ["<|task_controllable_tts|>", "<|task_tts|>"]
    marks = ["<|start_content|>", "<|end_content|>", "<|start_style_label|>", "<|end_style_label|>",
             "<|start_global_token|>", "<|end_global_token|>", "<|start_semantic_token|>",
             "<|end_semantic_token|>"]
    labels = [f"<|gender_{i}|>" for i in range(2)] + [f"<|pitch_label_{i}|>" for i in range(5)]
    labels += [f"<|speed_label_{i}|>" for i in range(5)]
    codes = ["<|bicodec_global_0|>"] + [f"<|bicodec_semantic_{i}|>" for i in range(_SPARK_SEMANTIC)]
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + task + marks + labels + codes


def _spark_bicodec_config() -> dict:
    w, d = _SPARK_WIDTH, _SPARK_D
    vocos = dict(vocos_dim=w, vocos_intermediate_dim=2 * w, vocos_num_layers=1)
    return {"audio_tokenizer": {
        "mel_params": {"sample_rate": 16000, "n_fft": 64, "win_length": 64, "hop_length": 32, "mel_fmin": 10,
                       "mel_fmax": None, "num_mels": 16},
        "encoder": dict(input_channels=w, out_channels=w, sample_ratios=[1, 1], **vocos),
        "quantizer": dict(input_dim=w, codebook_size=_SPARK_SEMANTIC, codebook_dim=8, commitment=0.25),
        "prenet": dict(input_channels=w, out_channels=d, condition_dim=d, sample_ratios=[1, 1],
                       use_tanh_at_final=False, **vocos),
        "postnet": dict(input_channels=d, out_channels=w, use_tanh_at_final=False, **vocos),
        # 320x upsampling (8*5*4*2): 50 semantic tokens a second at 16 kHz, as the real one
        # (128 channels down to 8: sanitize misreads the layout of a 7-tap conv over fewer inputs)
        "decoder": dict(input_channel=d, channels=128, rates=[8, 5, 4, 2], kernel_sizes=[16, 11, 8, 4]),
        # the speaker encoder's ECAPA-TDNN is fixed at 512 channels in code (5.5M parameters)
        "speaker_encoder": dict(input_dim=16, out_dim=d, latent_dim=8, token_num=1, fsq_levels=[4, 4],
                                fsq_num_quantizers=1),
    }}


def _spark_bicodec(folder: Path):
    """BiCodec/ (config.yaml, model.safetensors) built with the library's loader's classes."""
    import mlx.core as mx
    import yaml
    from mlx_audio.tts.models.spark.bicodec import BiCodec
    from mlx_audio.tts.models.spark.modules.encoder_decoder.feat_decoder import Decoder
    from mlx_audio.tts.models.spark.modules.encoder_decoder.feat_encoder import Encoder
    from mlx_audio.tts.models.spark.modules.encoder_decoder.wave_generator import WaveGenerator
    from mlx_audio.tts.models.spark.modules.residual import FactorizedVectorQuantize
    from mlx_audio.tts.models.spark.modules.speaker.speaker_encoder import SpeakerEncoder

    config = _spark_bicodec_config()
    (folder / "BiCodec").mkdir(parents=True, exist_ok=True)
    (folder / "BiCodec" / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = config["audio_tokenizer"]
    parts = dict(encoder=Encoder(**cfg["encoder"]), quantizer=FactorizedVectorQuantize(**cfg["quantizer"]),
                 prenet=Decoder(**cfg["prenet"]), postnet=Decoder(**cfg["postnet"]),
                 decoder=WaveGenerator(**cfg["decoder"]), speaker_encoder=SpeakerEncoder(**cfg["speaker_encoder"]))
    codec = BiCodec(mel_params=cfg["mel_params"], **parts)
    # The speaker vector is added to every frame; at full scale it is most of what one hears.
    codec.speaker_encoder.project.weight = codec.speaker_encoder.project.weight * 0.1
    codec.speaker_encoder.project.bias = mx.zeros_like(codec.speaker_encoder.project.bias)
    _unbiased(codec.prenet)  # (constant patterns likewise)
    _unbiased(codec.quantizer)
    probe_tokens = mx.random.randint(0, _SPARK_SEMANTIC, (1, 20))
    probe_global = mx.zeros((1, 1), dtype=mx.int32)
    _vocoder(codec.decoder, codec.decoder.model[-2], lambda: codec.detokenize(probe_tokens, probe_global))

    def sanitize(weights):  # as BiCodec.load_from_checkpoint chains them
        for part in ("encoder", "decoder", "quantizer", "speaker_encoder"):
            weights = parts[part].sanitize(weights)
        return weights

    weights = _fit(sanitize, _flat(codec))
    # The ECAPA speaker encoder only encodes reference audio (voice cloning, not exercised
    # here): stored in float16, half its 22 MB.
    weights = {k: v.astype(mx.float16) if k.startswith("speaker_encoder.speaker_encoder.") else v
               for k, v in weights.items()}
    _save(folder / "BiCodec" / "model.safetensors", weights)


def _spark_wav2vec(folder: Path):
    """wav2vec2-large-xlsr-53/ at a few channels: loaded with the model (it encodes reference
    audio for cloning) though text-only synthesis never runs it."""
    from mlx_audio.stt.models.wav2vec.wav2vec import ModelConfig, Wav2Vec2Model

    target = folder / "wav2vec2-large-xlsr-53"
    config = dict(model_type="wav2vec2", hidden_size=_SPARK_WIDTH, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, conv_dim=[8] * 7, num_conv_pos_embeddings=4,
                  num_conv_pos_embedding_groups=2, feat_extract_norm="layer", do_stable_layer_norm=True,
                  conv_bias=True)
    _write_json(target / "config.json", config)
    _write_json(target / "preprocessor_config.json", {
        "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 16000, "do_normalize": True})
    model = Wav2Vec2Model(ModelConfig.from_dict(config))
    _save(target / "model.safetensors", _fit(model.sanitize, _flat(model)))


def _build_spark(folder: Path):
    import mlx.core as mx
    import yaml
    from mlx_audio.tts.models.spark import Model, ModelConfig

    specials = _spark_specials()
    tok = _bpe(folder, specials, vocab=400, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    config = dict(model_type="spark", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tok), tie_word_embeddings=False,
                  max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
                  bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], sample_rate=16000)
    _write_json(folder / "config.json", config)
    (folder / "audio_tokenizer_config.yaml").write_text(yaml.safe_dump(
        {"sample_rate": 16000, "ref_segment_duration": 6, "latent_hop_length": 320, "volume_normalize": True}))
    model = Model(ModelConfig.from_dict(config))
    weights = _flat(model)
    # Only semantic tokens (and the one global token) may win: every other row of the head at
    # zero, below the largest of 64 semantic logits.
    semantic = [ids[f"<|bicodec_semantic_{i}|>"] for i in range(_SPARK_SEMANTIC)]
    head = _head(weights["lm_head.weight"].shape)
    keep = mx.zeros((head.shape[0], 1), dtype=mx.bool_)
    keep[mx.array(semantic)] = True
    head = mx.where(keep, head, 0.0)
    # The global token wins the first step: its row points where the hidden state at the
    # prompt's end points (measured on probe prompts); the recipe's repetition penalty then
    # keeps it from coming back.
    model.load_weights(list(weights.items()))
    hidden = [_spark_prompt_state(model, tok, text) for text in list(TEXTS) + CORPUS]
    direction = mx.mean(mx.stack([h / mx.linalg.norm(h) for h in hidden]), axis=0)
    head[ids["<|bicodec_global_0|>"]] = direction * (4.0 * LOGIT_STD / float(mx.linalg.norm(direction)))
    weights["lm_head.weight"] = head
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _spark_bicodec(folder)
    _spark_wav2vec(folder)


def _spark_prompt_state(model, tok, text: str):
    """The LM's final hidden state at the end of Spark's controllable-TTS prompt for `text`."""
    import mlx.core as mx

    prompt = model.process_prompt_control("male", "moderate", "moderate", text)
    ids = mx.array([tok.encode(prompt, add_special_tokens=False)])
    return model.model.model(ids)[0, -1]


# ---------------------------------------------------------------------------------------------
# MOSS-TTS (delay, local-transformer v1.0 and v1.5) and MOSS-TTS-Nano: LMs over MOSS audio
# tokenizer codes, the codec read from audio_tokenizer/ beside the model.

_MOSS_VQ, _MOSS_CODES = 4, 64  # codebooks (32 or 16 in the real ones) and codes in each (1024)
# The user turn's fixed fields (the processor writes "None" for each one not given) as single
# tokens: the prompt is then mostly the text, which otherwise hardly reaches the audio.
_MOSS_TEMPLATE = ["<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n"
                  "- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nNone\n- Text:\n", "\n</user_inst>"]
# Specials first in the vocabulary, in this order. With the text head at zero every text logit
# ties and greedy takes the lowest allowed id: outside audio the pad, the slots and
# <|audio_end|> are masked, so <|audio_start|> (id 1) starts the audio at once; inside it only
# the two slots are allowed, and the generation slot (the lower id) goes on until max_tokens.
# "assistant" is one token, as in Qwen's vocabulary: the audio is cut 3 tokens past the last
# <|im_start|> (<|im_start|>, assistant, \n).
_MOSS_SPECIALS = ["<|endoftext|>", "<|audio_start|>", "<|im_start|>", "<|im_end|>", "<|audio_end|>",
                  "<|audio_user_slot|>", "<|audio_assistant_gen_slot|>", "<|audio_assistant_delay_slot|>",
                  "assistant"] + _MOSS_TEMPLATE


def _moss_codec(folder: Path, n_vq: int = _MOSS_VQ, rate: int = 24000, hop: int = 1920):
    """audio_tokenizer/: a MOSS audio tokenizer of `n_vq` codebooks whose decoder is one small
    transformer and a patch step of `hop` samples a frame (no encoder: cloning not exercised)."""
    from mlx_audio.codec.models.moss_audio_tokenizer.moss_audio_tokenizer import (AudioTokenizerConfig,
                                                                                  MossAudioTokenizer)
    import mlx.core as mx

    width = 16
    transformer = dict(module_type="Transformer", input_dimension=width, output_dimension=hop, d_model=width,
                       num_heads=2, num_layers=1, dim_feedforward=2 * width, causal=True,
                       positional_embedding="rope", max_period=10000.0, layer_scale=0.01, norm="layer_norm",
                       conv_layout=True)
    config = dict(sample_rate=rate, sampling_rate=rate, downsample_rate=hop, number_channels=1,
                  enable_channel_interleave=True, encoder_kwargs=[],
                  decoder_kwargs=[transformer, {"module_type": "PatchedPretransform", "patch_size": hop}],
                  quantizer_type="rlfq",
                  quantizer_kwargs=dict(input_dim=width, rvq_dim=width, output_dim=width, num_quantizers=n_vq,
                                        codebook_size=_MOSS_CODES, codebook_dim=8))
    _write_json(folder / "audio_tokenizer" / "config.json", config)
    codec = MossAudioTokenizer(AudioTokenizerConfig.from_dict(config),
                               projection_keys={"decoder.0.output_proj.weight"})
    # the weight-normalised 1x1 convs start with a zero direction (a NaN weight): drawn here
    weights = _flat(codec)
    weights.update(_redrawn({k: v for k, v in weights.items() if v.ndim == 3}))
    codec.load_weights(list(weights.items()))
    probe = mx.random.randint(0, _MOSS_CODES, (12, n_vq))
    _loudness(codec.decoder[0].output_proj, lambda: codec.decode_audio_codes(probe))
    _save(folder / "audio_tokenizer" / "model.safetensors", _flat(codec))


def _moss_language(vocab: int) -> dict:
    return dict(model_type="qwen3", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6, vocab_size=vocab,
                max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False)


def _moss_ids(tok) -> dict:
    ids = {t: tok.convert_tokens_to_ids(t) for t in _MOSS_SPECIALS}
    return dict(pad_token_id=ids["<|endoftext|>"], im_start_token_id=ids["<|im_start|>"],
                im_end_token_id=ids["<|im_end|>"], audio_start_token_id=ids["<|audio_start|>"],
                audio_end_token_id=ids["<|audio_end|>"], audio_user_slot_token_id=ids["<|audio_user_slot|>"],
                audio_assistant_gen_slot_token_id=ids["<|audio_assistant_gen_slot|>"],
                audio_assistant_delay_slot_token_id=ids["<|audio_assistant_delay_slot|>"],
                n_vq=_MOSS_VQ, audio_vocab_size=_MOSS_CODES, audio_pad_code=_MOSS_CODES, sampling_rate=24000)


def _build_moss_delay(folder: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.moss_tts import Model, ModelConfig

    tok = _bpe(folder, _MOSS_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = dict(model_type="moss_tts_delay", language_config=_moss_language(len(tok)), **_moss_ids(tok))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    weights = _scaled_layers(_flat(model), "language_model.layers.")
    weights["lm_heads.0.weight"] = mx.zeros_like(weights["lm_heads.0.weight"])  # the text channel: ties
    for i in range(1, _MOSS_VQ + 1):
        key = f"lm_heads.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _moss_codec(folder)


def _build_moss_local_v10(folder: Path):
    """MOSS-TTS-Local-Transformer (v1.0 layout): a local transformer writes each frame's text
    token and codes; generation stops at <|audio_end|> on the text channel."""
    import mlx.core as mx
    from mlx_audio.tts.models.moss_tts import Model, ModelConfig

    tok = _bpe(folder, _MOSS_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    # With the text head at zero the text channel ties and takes id 0 (the pad) every frame:
    # never <|audio_end|>, so max_tokens sets the length.
    config = dict(model_type="moss_tts", language_config=_moss_language(len(tok)), additional_mlp_ffn_hidden_size=64,
                  local_ffn_hidden_size=64, local_hidden_size=32, local_num_layers=1, **_moss_ids(tok))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    weights = _scaled_layers(_flat(model), "model.language_model.layers.")
    weights["lm_heads.0.weight"] = mx.zeros_like(weights["lm_heads.0.weight"])
    for i in range(1, _MOSS_VQ + 1):
        key = f"lm_heads.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _moss_codec(folder)


# MOSS-TTS-Local-Transformer-v1.5 writes its prompt from these pieces, tokenized apart.
_MOSS15_SPECIALS = _MOSS_SPECIALS[:9] + [
    "<user_inst>\n- Reference(s):\n", "\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n"
    "- Sound Event:\nNone\n- Ambient Sound:\nNone\n- Language:\nNone\n- Text:\n", "\n</user_inst>"]


def _build_moss_local_v15(folder: Path):
    """MOSS-TTS-Local-Transformer-v1.5: a GPT-2 local transformer; each frame the text head
    chooses between the assistant slot (go on) and <|audio_end|>."""
    import mlx.core as mx
    from mlx_audio.tts.models.moss_tts import Model, ModelConfig

    tok = _bpe(folder, _MOSS15_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = _moss_ids(tok)
    # One assistant slot in v1.5. The text head at zero ties its two candidates, [slot,
    # <|audio_end|>], and greedy takes the first: the slot, every frame, until max_tokens.
    ids["audio_assistant_slot_token_id"] = ids.pop("audio_assistant_gen_slot_token_id")
    gpt2 = dict(n_embd=32, n_head=2, n_inner=64, n_layer=1, position_embedding_type="rope")
    config = dict(model_type="moss_tts_local", language_config=_moss_language(len(tok)), gpt2_config=gpt2,
                  local_transformer_layers=1, **ids)
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    weights = _scaled_layers(_flat(model), "transformer.layers.")
    weights["text_lm_head.weight"] = mx.zeros_like(weights["text_lm_head.weight"])
    for i in range(_MOSS_VQ):
        key = f"audio_lm_heads.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _moss_codec(folder)


def _sentencepiece(folder: Path, specials, vocab: int = 200):
    """tokenizer.model: a SentencePiece BPE trained here on CORPUS, `specials` at ids 3.. (after
    <unk>, <s>, </s>) as the config's control ids expect."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 4), model_writer=model, vocab_size=vocab,
                                   model_type="bpe", user_defined_symbols=list(specials), num_threads=1,
                                   character_coverage=1.0, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _build_moss_nano(folder: Path):
    """MOSS-TTS-Nano: a GPT-2 LM and GPT-2 local transformer whose heads are their embeddings."""
    from mlx_audio.tts.models.moss_tts_nano import Model, ModelConfig

    names = ["<pad>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_user_slot|>",
             "<|audio_assistant_slot|>"]
    folder.mkdir(parents=True, exist_ok=True)
    sp = _sentencepiece(folder, names)
    ids = {n: sp.piece_to_id(n) for n in names}
    gpt2 = dict(n_embd=32, n_head=2, n_inner=64, n_layer=2, vocab_size=sp.get_piece_size(), n_positions=4096,
                n_ctx=4096, position_embedding_type="rope")
    config = dict(model_type="moss_tts_nano", gpt2_config=gpt2, n_vq=_MOSS_VQ, audio_vocab_size=_MOSS_CODES,
                  audio_pad_token_id=_MOSS_CODES, pad_token_id=ids["<pad>"], im_start_token_id=ids["<|im_start|>"],
                  im_end_token_id=ids["<|im_end|>"], audio_start_token_id=ids["<|audio_start|>"],
                  audio_end_token_id=ids["<|audio_end|>"], audio_user_slot_token_id=ids["<|audio_user_slot|>"],
                  audio_assistant_slot_token_id=ids["<|audio_assistant_slot|>"], audio_tokenizer_sample_rate=24000,
                  local_transformer_layers=1)
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    # (six times: its template is most of the prompt, and at twice the codes hardly moved)
    weights = _scaled_layers(_flat(model), "transformer.h.", gain=6.0)
    # The text head is the token embedding: <|audio_end|>'s row a copy of the assistant slot's
    # ties the two candidates every frame, and the first (the slot) wins until max_tokens.
    wte = weights["transformer.wte.weight"]
    wte[ids["<|audio_end|>"]] = wte[ids["<|audio_assistant_slot|>"]]
    for i in range(_MOSS_VQ):  # the audio heads are the code embeddings: drawn for wide margins
        key = f"audio_embeddings.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _moss_codec(folder)


# ---------------------------------------------------------------------------------------------
# OmniVoice: a bidirectional Qwen3 unmasks 8 codebooks of HiggsAudio v2 codes in a few steps.

_OMNI_SPECIALS = ["<|endoftext|>", "<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>",
                  "<|instruct_end|>", "<|text_start|>", "<|text_end|>"]


def _omnivoice_codec(folder: Path):
    """audio_tokenizer/: HiggsAudio v2, whose classes take no sizes (73M parameters; the
    acoustic encoder alone 51M) -- stored in float16 (147 MB), which it then runs in."""
    import mlx.core as mx
    from mlx_audio.codec.models.higgs_audio.config import HiggsAudioConfig
    from mlx_audio.codec.models.higgs_audio.higgs_audio import HiggsAudioTokenizer

    config = HiggsAudioConfig()
    _write_json(folder / "audio_tokenizer" / "config.json",
                {k: getattr(config, k) for k in ("model_type", "sample_rate", "codebook_size", "codebook_dim",
                                                 "downsample_factor", "dac_num_codebooks", "dac_encoder_ratios")})
    codec = HiggsAudioTokenizer(config)
    weights = {k: v.astype(mx.float16) for k, v in _flat(codec).items()}
    codec.load_weights(list(weights.items()))
    for part in (codec.quantizer, codec.fc2, codec.acoustic_decoder):  # no common pattern every frame
        _unbiased(part)
    probe = mx.random.randint(0, 1024, (4, 8))
    _loudness(codec.acoustic_decoder.conv2, lambda: codec.decode(probe), passes=1)
    _save(folder / "audio_tokenizer" / "model.safetensors", _fit(codec.sanitize, _flat(codec)))


def _build_omnivoice(folder: Path):
    from mlx_audio.tts.models.omnivoice.config import OmniVoiceConfig
    from mlx_audio.tts.models.omnivoice.omnivoice import Model

    tok = _bpe(folder, _OMNI_SPECIALS, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    llm = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=64, vocab_size=len(tok), head_dim=16, rope_theta=10000.0)
    config = dict(model_type="omnivoice", audio_vocab_size=1025, audio_mask_id=1024, num_audio_codebook=8,
                  sample_rate=24000, llm_config=llm)
    _write_json(folder / "config.json", config)
    model = Model(OmniVoiceConfig.from_dict(config))
    weights = _flat(model)
    for i in range(8):
        key = f"audio_heads.{i}.weight"
        weights[key] = _head(weights[key].shape)
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    _omnivoice_codec(folder)


# ---------------------------------------------------------------------------------------------
# Voxtral TTS: a Mistral LM whose hidden state gives each 80 ms frame a semantic code (argmax) and
# acoustic codes (flow matching); a Mistral tekken tokenizer writes the speech prompt.

_VOXTRAL_VOICES = {"casual_male": 3, "neutral_female": 3}  # voice -> audio tokens in its prompt
_VOXTRAL_AUDIO = ["[AUDIO]", "[BEGIN_AUDIO]", "[NEXT_AUDIO_TEXT]", "[REPEAT_AUDIO_TEXT]", "[TRANSCRIBE]"]
_VOXTRAL_SPECIALS = 32  # special ranks before the 256 byte tokens


def _tekken(folder: Path) -> Dict[str, int]:
    """tekken.json: a byte-level tekken tokenizer (the 256 bytes, no merges) with the control
    tokens the v7 instruct tokenizer looks up, the speech markers and two preset voices;
    returns the special tokens' ranks."""
    import base64

    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    specials = [t["token_str"] for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS] + _VOXTRAL_AUDIO
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None}
             for i in range(256)]
    # the pre-tokenizer pattern: words, numbers, punctuation, spaces (a byte vocabulary needs no more)
    pattern = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    data = {"config": {"pattern": pattern, "num_vocab_tokens": 256, "default_vocab_size": 256 + _VOXTRAL_SPECIALS,
                       "default_num_special_tokens": _VOXTRAL_SPECIALS, "version": "v7"},
            "vocab": vocab,
            "special_tokens": [{"rank": i, "token_str": t, "is_control": True} for i, t in enumerate(specials)],
            "audio": {"sampling_rate": 24000, "frame_rate": 12.5,
                      "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400},
                      "voice_num_audio_tokens": dict(_VOXTRAL_VOICES)},
            "type": "Tekken", "version": 1}
    _write_json(folder / "tekken.json", data)
    return {t: i for i, t in enumerate(specials)}


def _voxtral_config(ranks: Dict[str, int]) -> dict:
    return dict(
        model_type="voxtral_tts", dim=32, n_layers=2, head_dim=16, hidden_dim=64, n_heads=2, n_kv_heads=1,
        vocab_size=256 + _VOXTRAL_SPECIALS, rope_theta=10000.0, max_position_embeddings=4096, sample_rate=24000,
        semantic_codebook_size=64, acoustic_codebook_size=21, n_acoustic_codebook=4, num_codebooks=5,
        acoustic_dim=32, acoustic_n_layers=1, acoustic_head_dim=16, acoustic_hidden_dim=64, acoustic_n_heads=2,
        acoustic_n_kv_heads=1,
        # The flow's starting noise is mx.random.normal * sigma_max, drawn unseeded (1.0 in the
        # real model): at 0 the acoustic codes are a function of the text alone.
        acoustic_sigma_max=0.0,
        # the real decoder's layout (conv strides 1,2,2,2 and 240-sample patches: 1920 samples a
        # frame) at 32 channels, one layer a stage
        tokenizer_dim=32, tokenizer_hidden_dim=64, tokenizer_n_heads=2, tokenizer_n_kv_heads=2,
        tokenizer_head_dim=16, tokenizer_semantic_dim=16, tokenizer_acoustic_dim=4,
        tokenizer_decoder_transformer_lengths_str="1,1,1,1",
        bos_token_id=ranks["<s>"], audio_token_id=ranks["[AUDIO]"], begin_audio_token_id=ranks["[BEGIN_AUDIO]"])


def _build_voxtral_tts(folder: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.voxtral_tts import Model, ModelConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = _voxtral_config(_tekken(folder))
    _write_json(folder / "config.json", config)
    model = Model(ModelConfig.from_dict(config))
    codec = model.audio_tokenizer
    # The weight-normalised convs start with a zero direction (silence), the semantic codebook
    # with zero sums: drawn here.
    weights = _flat(codec)
    weights.update(_redrawn({k: v for k, v in weights.items() if v.ndim == 3}))
    weights["quantizer.semantic_codebook.embedding_sum"] = mx.random.normal(
        weights["quantizer.semantic_codebook.embedding_sum"].shape)
    codec.load_weights(list(weights.items()))
    probe = mx.concatenate([mx.random.randint(2, 66, (1, 6, 1)), mx.random.randint(2, 23, (1, 6, 4))], axis=-1)
    _voxtral_loudness(codec, probe)
    weights = _flat(model)
    head = "acoustic_transformer.semantic_codebook_output.weight"
    weights[head] = _damp_rows(_head(weights[head].shape), [1])  # END_AUDIO (code 1): never the argmax
    _save(folder / "model.safetensors", _fit(model.sanitize, weights))
    for voice, frames in _VOXTRAL_VOICES.items():
        _save(folder / "voice_embedding" / f"{voice}.safetensors", {"embedding": mx.random.normal((frames, 32))})


def _voxtral_loudness(codec, probe, rms: float = 0.1):
    """The decoder's output projection's gains (weight-norm g) scaled so a probe is audible."""
    import mlx.core as mx

    gains = codec.output_proj.conv.parametrizations["weight"]
    for _ in range(2):
        got = float(mx.sqrt(mx.mean(mx.square(codec.decode(probe)))).item())
        gains["original0"] = gains["original0"] * (rms / got)


# ---------------------------------------------------------------------------------------------

RECIPES: Dict[str, AudioRecipe] = {
    "qwen3_tts": AudioRecipe(
        "qwen3_tts", "tts", _build_qwen3_tts,
        generate={"voice": "ryan", "temperature": 0.0, "max_tokens": 10}, inputs=TEXTS,
        note="CustomVoice talker (speakers ryan, vivian), 4 code groups, 12.5 Hz decoder"),
    "soprano": AudioRecipe(
        "soprano", "tts", _build_soprano, generate={"temperature": 0.0, "max_tokens": 12}, inputs=TEXTS,
        note="2-layer Qwen3 LM; the Vocos decoder's size is fixed in code (512 channels, 8 layers)"),
    "pocket_tts": AudioRecipe(
        "pocket_tts", "tts", _build_pocket_tts, generate={"voice": "alba", "temperature": 0.0}, inputs=TEXTS,
        note="2-layer flow LM, 4-channel Mimi-style decoder, voices alba and marius"),
    "vibevoice": AudioRecipe(
        "vibevoice", "tts", _build_vibevoice, generate={"voice": "en-carter_man", "max_tokens": 12},
        inputs=TEXTS, note="streaming variant: 1+1-layer Qwen2, 1-layer diffusion head, 2-128 channel VAE"),
    "spark": AudioRecipe(
        "spark", "tts", _build_spark,
        generate={"gender": "male", "temperature": 0.0, "max_tokens": 16, "repetition_penalty": 1000.0},
        inputs=TEXTS, note="2-layer Qwen2 LM, BiCodec at 8-128 channels (its ECAPA speaker encoder fixed at 512)"),
    "moss_tts_delay": AudioRecipe(
        "moss_tts_delay", "tts", _build_moss_delay,
        generate={"max_tokens": 12, "text_temperature": 0.0, "audio_temperature": 0.0}, inputs=TEXTS,
        note="delay-pattern Qwen3 LM over 4 codebooks, 1-layer MOSS audio tokenizer decoder"),
    "moss_tts": AudioRecipe(
        "moss_tts", "tts", _build_moss_local_v10,
        generate={"max_tokens": 8, "text_temperature": 0.0, "audio_temperature": 0.0}, inputs=TEXTS,
        note="local-transformer v1.0 layout: Qwen3 LM + 1-layer local transformer over 4 codebooks"),
    "moss_tts_local": AudioRecipe(
        "moss_tts_local", "tts", _build_moss_local_v15,
        generate={"max_tokens": 8, "text_temperature": 0.0, "audio_temperature": 0.0}, inputs=TEXTS,
        note="local-transformer v1.5: Qwen3 LM + 1-layer GPT-2 local transformer over 4 codebooks"),
    "moss_tts_nano": AudioRecipe(
        "moss_tts_nano", "tts", _build_moss_nano,
        generate={"mode": "continuation", "max_tokens": 8, "do_sample": False}, inputs=TEXTS,
        note="2-layer GPT-2 LM + 1-layer local GPT-2 (tied heads), SentencePiece tokenizer, 4 codebooks"),
    "omnivoice": AudioRecipe(
        "omnivoice", "tts", _build_omnivoice,
        generate={"duration_s": 0.4, "num_steps": 4, "position_temperature": 0.0, "class_temperature": 0.0},
        inputs=TEXTS, note="2-layer bidirectional Qwen3; the HiggsAudio v2 codec is fixed in code (73M, fp16)"),
    "voxtral_tts": AudioRecipe(
        "voxtral_tts", "tts", _build_voxtral_tts, generate={"voice": "casual_male", "max_tokens": 10},
        inputs=TEXTS, note="2-layer Mistral LM, 1-layer flow head, 4 acoustic codebooks, byte-level tekken"),
}

NOT_BUILT: Dict[str, str] = {
    "sesame": ("its Model.__init__ loads the Mimi codec with Mimi.from_pretrained('kyutai/moshiko-pytorch-bf16'): "
               "hf_hub_download by a repo id fixed in code, whatever the folder holds; the codec's size is fixed "
               "too (mimi_202407: 96M parameters, 385 MB in float32, 3.5-4 s to decode 0.8 s of audio here). Its "
               "default voice prompt is also fetched from the hub (sesame/csm-1b prompts/*.wav)"),
    "rumik_oss": ("decodes with Mimi.from_pretrained(config.mimi_repo): hf_hub_download takes a hub repo id, not "
                  "a folder, and the codec's size is fixed in code (mimi_202407: 96M parameters, 385 MB)"),
    "qwen3": ("importing the package runs SNAC.from_pretrained('mlx-community/snac_24khz') (snapshot_download at "
              "module level), so even loading fails without the hub. (The tts loader picks this package for a "
              "config whose model_type is 'qwen3' when the folder's name names no other family; "
              "mlx_audio.registry.classify_model never calls a bare 'qwen3' a TTS model.)"),
    "outetts": ("generate() builds AudioProcessor(), whose DAC codec is DAC.from_pretrained("
                "'mlx-community/dac-speech-24khz-1.5kbps'): snapshot_download by a repo id fixed in code; the text "
                "tokenizer is AutoTokenizer.from_pretrained(config.tokenizer_name), a hub id by default"),
    "melotts": ("its English front end tokenizes every text with AutoTokenizer.from_pretrained('bert-base-uncased') "
                "(melotts/text.py _get_tokenizer: a hub id fixed in code) and needs the g2p_en package"),
    "tada": ("post_load_hook loads the text tokenizer with AutoTokenizer.from_pretrained("
             "'meta-llama/Llama-3.2-1B-Instruct') (a hub id fixed in code) and the codec from TADA_CODEC_PATH or "
             "the hub repo HumeAI/tada-codec"),
    "voxcpm": ("not deterministic as the oracle calls it: every patch starts its CFM solve from "
               "mx.random.normal noise (dit.py UnifiedCFM.sample, temperature fixed at 1.0 by generate, no seed "
               "or temperature keyword) drawn from MLX's unseeded global generator, and the Euler solve adds it "
               "to the result (x = z - sum(dt * v)), so no weights make two runs agree; it would need "
               "mx.random.seed(...) before each call, in the oracle and the server alike"),
    "voxcpm2": ("not deterministic as the oracle calls it, as voxcpm: its CFM solve starts from unseeded "
                "mx.random.normal noise (dit.py sample, temperature fixed at 1.0 by generate) that the Euler "
                "solve carries into the audio; no generate keyword seeds or disables it"),
    "zonos2": ("decodes with DAC.from_pretrained(config.dac_model_id): snapshot_download takes a hub repo id "
               "('mlx-community/descript-audio-codec-44khz'), not a folder"),
}
