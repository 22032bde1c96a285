"""Tiny random-weight models of mlx-audio's text-to-speech families A-L (Kokoro, KittenTTS, ...).

Each recipe builds the family's own mlx-audio classes at the smallest widths its code allows,
seeded by the builder, and writes the folder its loader reads: config.json, the weights in a
key layout the family's `sanitize` hands back unchanged (checked key by key by `_stored`), and
the assets its generate reads (voice packs, a phoneme vocabulary, a tokenizer trained here, a
codec or vocoder beside the model). NOT_BUILT says, for the other families, what stops it.

Random weights need conditioning to give a usable test signal:
- the library starts some matrices at a constant (a weight-normalised convolution's direction
  vectors at 1, a zero output head): left so, all channels are equal and the output ignores
  the text, so they get random values of the usual scale (`_varied`);
- where the text reaches the audio only weakly (a flow whose noise is the same for both
  texts, a codec whose biases add the same pattern to every frame) the paths that carry it are
  made louder, the biases zeroed (`_gained`), and the last layer of a vocoder is scaled so the
  waveform has a speech-like level (`_scaled`);
- sampling is made reproducible through generate's own arguments: greedy decoding
  (temperature 0) for the codec language models, generate's seed for the flow models; the
  StyleTTS vocoders (Kokoro, KittenTTS) draw a random phase and noise at every call with no
  seed, so their harmonic source's mixing layer is zeroed (the excitation is then a
  constant, and the F0 curve still reaches the decoder through its own convolution);
- an "end of audio" class is silenced where random weights would stop at a random step: the
  length is bounded by the recipe's `max_tokens` instead.
"""

from pathlib import Path
from typing import Dict

from zoo.audio.recipe import AudioRecipe

# ---------------------------------------------------------------------------------------------
# Shared helpers


def _flat(model) -> Dict[str, object]:
    """The model's parameters by key, constant matrices replaced by random ones."""
    from mlx.utils import tree_flatten

    return {k: _varied(v) for k, v in tree_flatten(model.parameters())}


def _varied(w):
    """`w`, or random values of the usual scale where the library starts it as a constant
    matrix (a checkpoint never holds one; left so, all its output channels are equal)."""
    import mlx.core as mx

    if w.ndim < 2 or w.size == w.shape[0]:  # a vector, or per-channel gains (weight_g): constants are fine
        return w
    if float(mx.std(w.astype(mx.float32)).item()) == 0.0:
        fan_in = w.size // w.shape[0]
        return (mx.random.normal(w.shape) * fan_in ** -0.5).astype(w.dtype)
    return w


def _layouts(w):
    """`w` first, then the other axis orders a converted checkpoint may hold it in."""
    import itertools

    import mlx.core as mx

    yield w
    if w.ndim >= 3:
        for order in itertools.permutations(range(w.ndim)):
            if list(order) != list(range(w.ndim)):
                yield mx.transpose(w, order)


def _stored(sanitize, weights: Dict[str, object]) -> Dict[str, object]:
    """`weights` (the model's own keys and layout) as a file must hold them so that the
    family's `sanitize`, which guesses a layout from each array's shape, gives them back."""
    import mlx.core as mx

    out = {}
    for key, w in weights.items():
        for candidate in _layouts(w):
            got = sanitize({key: candidate})
            if key in got and got[key].shape == w.shape and bool(mx.array_equal(got[key], w)):
                out[key] = candidate
                break
        else:
            raise ValueError(f"sanitize changes {key} {tuple(w.shape)} in every layout")
    return out


def _write(folder: Path, config: dict, weights: Dict[str, object]):
    import json

    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)


def _scaled(weights: Dict[str, object], suffix: str, factor: float) -> Dict[str, object]:
    """`weights` with those whose key ends with `suffix` multiplied by `factor` (a random
    vocoder's last layer: a speech-like level instead of clipping or near-silence)."""
    return {k: v * factor if k.endswith(suffix) else v for k, v in weights.items()}


def _gained(weights: Dict[str, object], gains) -> Dict[str, object]:
    """`weights` with every matrix whose key contains a part of `gains` ((part, factor), first
    match wins) multiplied by its factor: the paths that carry the text made loud enough that
    the text, not the shared noise or the biases, shapes the audio."""
    out = {}
    for key, w in weights.items():
        factor = next((f for part, f in gains if part in key), 1.0) if w.ndim >= 2 else 1.0
        out[key] = w * factor
    return out


def _final(folder: Path) -> Path:
    """Where the folder will be read from: builder.py builds into '<name>.partial-<pid>' and
    renames it to '<name>'. For the families whose config names an asset by an absolute path
    (a tokenizer), not relative to the model folder."""
    return folder.with_name(folder.name.split(".partial-")[0])


# Sentences the small tokenizers are trained on: the recipes' inputs come out in few tokens.
CORPUS = [
    "Hello there. A different sentence, longer. The quick brown fox jumps over the lazy dog.",
    "How are you today? One two three four five. The cat sat on the mat in the sun.",
    "system user assistant: convert the provided text to speech, please.",
]


def _bpe(folder: Path, specials=(), vocab: int = 320, **named):
    """A byte-level BPE trained here on CORPUS, saved in `folder` as a fast tokenizer;
    `named` are its special roles (pad_token="<pad>", eos_token=...). Returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(CORPUS * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **named)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    return tok


# ---------------------------------------------------------------------------------------------
# Kokoro and KittenTTS: StyleTTS 2 style models (ALBERT text encoder, prosody predictor,
# iSTFTNet vocoder) over espeak-ng phonemes.

# The characters a phoneme string may hold: espeak-ng's IPA output with stress marks and
# punctuation. Kokoro reads its vocabulary from config.json, so this order is ours.
PHONEME_SYMBOLS = (
    " .,!?;:'\"()-—…«»“”¡¿"
    "abcdefghijklmnopqrstuvwxyz"
    "ˈˌːˑ̩̃ʰʲʷ"
    "æɐɑɒɓɔɕçðɖɗəɘɚɛɜɝɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʤʧβθχᵻ"
    "AIOQWY"  # misaki's one-letter diphthongs (A = eɪ, I = aɪ, O = oʊ, ...)
)
STYLE_WIDTH = 256  # a voice vector: 128 for the decoder, 128 for the prosody predictor (fixed in code)


def _istft_source_off(weights: Dict[str, object], post_gain: float) -> Dict[str, object]:
    """The vocoder's harmonic source silenced (its random phase and noise no longer reach the
    output) and its output convolution scaled so exp(magnitude) stays in range."""
    import mlx.core as mx

    out = dict(weights)
    for key in out:
        if key.endswith("m_source.l_linear.weight"):
            out[key] = mx.zeros_like(out[key])
        if key.endswith("generator.conv_post.weight_g"):
            out[key] = out[key] * post_gain
    return out


KOKORO_VOICES = ("af_heart", "ef_dora")  # the default voice, and the Spanish one the recipe uses


def build_kokoro(folder: Path):
    import mlx.core as mx

    from mlx_audio.tts.models.kokoro import Model, ModelConfig

    vocab = {s: i + 1 for i, s in enumerate(dict.fromkeys(PHONEME_SYMBOLS))}  # 0 pads the ends
    config = {
        "model_type": "kokoro",
        # The decoder's widths are fixed in code (1024 and 512 channels, hidden_dim 512, style
        # 128: 57M parameters whatever the config); the ALBERT encoder, the depth and the
        # vocoder's upsampling are ours. Two x2 steps and a hop of 75 make the same 300
        # samples a frame as the real 10 x 6 and hop 5, with the generator's fixed 256- and
        # 128-channel stages (dilated convolutions, slow on this CPU) run on 15 times fewer frames.
        "istftnet": {
            "upsample_kernel_sizes": [4, 4],
            "upsample_rates": [2, 2],
            "gen_istft_hop_size": 75,
            "gen_istft_n_fft": 150,
            "resblock_dilation_sizes": [[1, 3, 5]],
            "resblock_kernel_sizes": [3],
            "upsample_initial_channel": 512,
        },
        "dim_in": 64,
        "dropout": 0.2,
        "hidden_dim": 512,
        "max_conv_dim": 512,
        "max_dur": 3,  # one to three frames (25 ms each) a phoneme: short audio, still varied
        "multispeaker": True,
        "n_layer": 1,
        "n_mels": 80,
        "n_token": len(vocab) + 1,
        "style_dim": 128,
        "text_encoder_kernel_size": 5,
        "plbert": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 512,
            "num_hidden_layers": 1,
            "embedding_size": 16,
            "dropout": 0.1,
        },
        "vocab": vocab,
        "sample_rate": 24000,
    }
    model = Model(ModelConfig.from_dict(config))
    weights = _istft_source_off(_flat(model), post_gain=0.03)
    _write(folder, config, _stored(model.sanitize, weights))
    # Voice packs: one style vector per phoneme-string length (the pipeline picks row len-1).
    (folder / "voices").mkdir()
    for name in KOKORO_VOICES:
        mx.save_safetensors(str(folder / "voices" / f"{name}.safetensors"),
                            {"voice": mx.random.normal((510, 1, STYLE_WIDTH))})


KITTEN_VOICES = ("expr-voice-5-m", "expr-voice-2-f")  # the default first


def build_kitten(folder: Path):
    import mlx.core as mx
    import numpy as np

    from mlx_audio.tts.models.kitten_tts import Model, ModelConfig

    config = {
        "model_type": "kitten_tts",
        "hidden_dim": 32,
        "max_conv_dim": 32,
        "decoder_out_dim": 32,
        "asr_res_dim": 16,
        "max_dur": 3,
        "n_layer": 1,
        "n_mels": 80,
        "n_token": 178,  # the size of the symbol table KittenTTS's TextCleaner indexes into
        "style_dim": 128,
        "text_encoder_kernel_size": 5,
        "plbert": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 512,
            "num_hidden_layers": 1,
            "embedding_size": 16,
        },
        "istftnet": {
            "upsample_kernel_sizes": [11, 7],
            "upsample_rates": [5, 3],
            "gen_istft_hop_size": 20,
            "gen_istft_n_fft": 40,
            "resblock_dilation_sizes": [[1, 3, 5]],
            "resblock_kernel_sizes": [3],
            "upsample_initial_channel": 32,
        },
        "sample_rate": 24000,
        "voices_path": "voices.npz",
    }
    model = Model(ModelConfig.from_dict(config))
    weights = _istft_source_off(_flat(model), post_gain=0.03)
    _write(folder, config, _stored(model.sanitize, weights))
    # A voice: one style vector per text length (generate reads row min(len(text), rows - 1)).
    voices = {name: np.array(mx.random.normal((64, STYLE_WIDTH))) for name in KITTEN_VOICES}
    np.savez(folder / "voices.npz", **voices)


# ---------------------------------------------------------------------------------------------
# LongCat-AudioDiT: UMT5 text encoder, a DiT run as a flow-matching ODE, a WAV-VAE decoder.


def build_longcat(folder: Path):
    from mlx_audio.tts.models.longcat_audiodit import Model, ModelConfig

    # The tokenizer is read by its config name with AutoTokenizer, which takes a hub id or a
    # path: the absolute path of the built folder's own copy.
    tok = _bpe(folder / "text_tokenizer", ["<pad>", "</s>"], pad_token="<pad>", eos_token="</s>")
    config = {
        "model_type": "audiodit",
        "dit_dim": 32,
        "dit_depth": 2,
        "dit_heads": 2,
        "dit_ff_mult": 2.0,
        "dit_text_dim": 32,
        "repa_dit_layer": 1,
        "latent_dim": 8,
        "sampling_rate": 24000,
        "latent_hop": 2048,
        "text_encoder_model": str(_final(folder) / "text_tokenizer"),
        # A VAE of 16 channels (its shortcuts split channels evenly: a multiple of both latent
        # widths) with the real 2048-sample hop (8 x 16 x 16 instead of 2 x 4 x 4 x 8 x 8).
        "vae_config": {
            "channels": 16,
            "c_mults": [1, 1, 1],
            "strides": [8, 16, 16],
            "latent_dim": 8,
            "encoder_latent_dim": 16,
            "downsampling_ratio": 2048,
            "sample_rate": 24000,
        },
        "text_encoder_config": {
            "vocab_size": len(tok),
            "d_model": 32,
            "d_kv": 16,
            "d_ff": 64,
            "num_layers": 1,
            "num_heads": 2,
        },
    }
    model = Model(ModelConfig.from_dict(config))
    weights = _scaled(_flat(model), "vae.decoder.layers.5.weight", 0.03)  # the output convolution
    _write(folder, config, _stored(model.sanitize, weights))


# ---------------------------------------------------------------------------------------------
# Irodori-TTS: a rectified-flow DiT over DACVAE latents (48 kHz), seeded by generate's rng_seed.


def build_irodori(folder: Path):
    import json

    import mlx.core as mx

    from mlx_audio.codec.models.dacvae import DACVAE, DACVAEConfig
    from mlx_audio.tts.models.irodori_tts import Model, ModelConfig

    # The loader prefers a tokenizer bundled in tokenizer/ over its config's hub repo.
    tok = _bpe(folder / "tokenizer", ["<pad>", "<s>", "</s>"], pad_token="<pad>", bos_token="<s>",
               eos_token="</s>")
    latent = 8  # the DiT's latent width is the codec's codebook_dim
    config = {
        "model_type": "irodori_tts",
        "sample_rate": 48000,
        "max_text_length": 64,
        "audio_downsample_factor": 1920,
        "dit": {
            "latent_dim": latent,
            "model_dim": 32,
            "num_layers": 2,
            "num_heads": 2,
            "mlp_ratio": 2.0,
            "text_mlp_ratio": 2.0,
            "speaker_mlp_ratio": 2.0,
            "text_vocab_size": len(tok),
            "text_dim": 32,
            "text_layers": 1,
            "text_heads": 2,
            "speaker_dim": 32,
            "speaker_layers": 1,
            "speaker_heads": 2,
            "timestep_embed_dim": 32,
            "adaln_rank": 8,
        },
        # No duration predictor: the sampler's sequence_length is the length (12 latent frames,
        # 0.48 s); 8 Euler steps instead of 40.
        "sampler": {"num_steps": 8, "sequence_length": 12},
    }
    model = Model(ModelConfig.from_dict(config))
    # At the library's initial scale the velocity barely reads the text: its text keys and values
    # and the attention outputs are scaled up, so the two inputs give clearly different latents.
    weights = _flat(model)
    for part, gain in (("_text.weight", 4.0), ("attention.wo.weight", 3.0), ("out_proj.weight", 3.0)):
        weights = _scaled(weights, part, gain)
    _write(folder, config, _stored(model.sanitize, weights))
    # The codec: a small DACVAE with the real 1920-sample hop (its decoder halves the width at each
    # of 4 blocks and splits a third of it off twice more: 96 is the least that leaves a channel).
    codec = {"encoder_dim": 4, "encoder_rates": [2, 8, 10, 12], "latent_dim": 16, "decoder_dim": 96,
             "decoder_rates": [12, 10, 8, 2], "n_codebooks": 1, "codebook_size": 8, "codebook_dim": latent,
             "sample_rate": 48000}
    dac = DACVAE(DACVAEConfig(**codec))
    (folder / "dacvae").mkdir()
    (folder / "dacvae" / "config.json").write_text(json.dumps(codec, indent=1))
    mx.save_safetensors(str(folder / "dacvae" / "model.safetensors"),
                        _scaled(_flat(dac), "decoder.conv_out.weight_g", 50.0))


# ---------------------------------------------------------------------------------------------
# Higgs Audio v3: a Qwen3 backbone whose audio head (tied to the audio embedding) emits 8
# delayed codebooks, decoded by the Higgs v2 codec bundled in audio_tokenizer/.

HIGGS_SPECIALS = ["<|endoftext|>", "<|tts|>", "<|ref_audio|>", "<|text|>", "<|audio|>", "<|ref_text|>"]


def build_higgs_v3(folder: Path):
    import mlx.core as mx

    from mlx_audio.codec.models.higgs_audio.config import HiggsAudioConfig
    from mlx_audio.codec.models.higgs_audio.higgs_audio import HiggsAudioTokenizer
    from mlx_audio.tts.models.higgs_audio_v3 import Model
    from mlx_audio.tts.models.higgs_audio_v3.config import HiggsAudioV3Config

    tok = _bpe(folder, HIGGS_SPECIALS, eos_token="<|endoftext|>")
    books, size = 8, 1026  # the codec's 8 codebooks of 1024, plus begin/end-of-audio codes
    config = {
        "model_type": "higgs_audio_v3",
        "text_config": {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                        "max_position_embeddings": 512, "vocab_size": len(tok),
                        "tie_word_embeddings": True, "rope_theta": 10000.0},
        "audio_num_codebooks": books,
        "audio_codebook_size": size,
        "sample_rate": 24000,
    }
    model = Model(HiggsAudioV3Config.from_dict(config))
    weights = _flat(model)
    # The audio head is the audio embedding: the rows of the begin/end-of-audio codes are shrunk
    # so greedy never picks them (with random weights "end" would come at a random step, and a
    # begin code inside the audio indexes past the codec's 1024-entry codebooks); the length
    # is the recipe's max_tokens.
    rows = mx.arange(books * size) % size
    key = "multimodal_embedding.weight"
    weights[key] = mx.where((rows >= size - 2)[:, None], weights[key] * 0.001, weights[key])
    _write(folder, config, _stored(model.sanitize, weights))
    # The codec's sizes are fixed in code (HiggsAudioTokenizer takes none from its config).
    codec = HiggsAudioTokenizer(HiggsAudioConfig())
    (folder / "audio_tokenizer").mkdir()
    (folder / "audio_tokenizer" / "config.json").write_text('{"model_type": "higgs_audio_v2_tokenizer"}')
    mx.save_safetensors(str(folder / "audio_tokenizer" / "model.safetensors"),
                        _stored(codec.sanitize, _scaled(_flat(codec), "acoustic_decoder.conv2.weight", 300.0)))


# ---------------------------------------------------------------------------------------------
# Breeze TTS 2: a T5Gemma2 text encoder, a Qwen3 backbone picking each frame's first codebook,
# a depth decoder the rest, the Qwen3-TTS 12.5 Hz codec (audio_tokenizer/) turning codes to audio.

BREEZE_BOOKS, BREEZE_CODES = 4, 16  # codebooks a frame, entries a codebook (the real one: 16 of 2048)


def _breeze_codec(folder: Path):
    import json

    import mlx.core as mx

    from mlx_audio.tts.models.qwen3_tts.config import (
        Qwen3TTSTokenizerConfig,
        Qwen3TTSTokenizerDecoderConfig,
        Qwen3TTSTokenizerEncoderConfig,
    )
    from mlx_audio.tts.models.qwen3_tts.speech_tokenizer import Qwen3TTSSpeechTokenizer

    # 1920 samples a frame both ways, as the real codec, at a few channels. The codec's sanitize
    # tells a 1x1 convolution's layout by whether its input side exceeds 64, so every 1x1
    # convolution here reads more than 64 channels: quantizer projections of 160 (decoder) and
    # 80 (encoder) wide, no vocoder blocks in the decoder (all its upsampling, 8 x 8 x 30, in
    # the latent stages), and two encoder stages (8 x 6, then a stride-40 downsample) of 130+.
    decoder = {"latent_dim": 32, "codebook_dim": 160, "codebook_size": BREEZE_CODES, "decoder_dim": 16,
               "hidden_size": 16, "intermediate_size": 32, "head_dim": 8, "num_attention_heads": 2,
               "num_key_value_heads": 2, "num_hidden_layers": 1, "num_quantizers": BREEZE_BOOKS,
               "semantic_codebook_size": BREEZE_CODES, "vector_quantization_hidden_dimension": 16,
               "upsampling_ratios": [8, 8, 30], "upsample_rates": []}
    encoder = {"hidden_size": 80, "intermediate_size": 160, "head_dim": 40, "num_attention_heads": 2,
               "num_key_value_heads": 2, "num_hidden_layers": 1, "num_filters": 130, "upsampling_ratios": [8, 6],
               "codebook_dim": 80, "codebook_size": BREEZE_CODES, "num_quantizers": BREEZE_BOOKS,
               "vector_quantization_hidden_dimension": 80}
    config = {"decoder_config": decoder, "encoder_config": encoder, "encoder_valid_num_quantizers": BREEZE_BOOKS,
              "input_sample_rate": 24000, "output_sample_rate": 24000, "decode_upsample_rate": 1920,
              "encode_downsample_rate": 1920}
    codec = Qwen3TTSSpeechTokenizer(Qwen3TTSTokenizerConfig(
        decoder_config=Qwen3TTSTokenizerDecoderConfig(**decoder),
        encoder_config=Qwen3TTSTokenizerEncoderConfig(**encoder)))
    # At the library's initial scale the codes barely reach the waveform (each layer shrinks the
    # signal and the biases add the same pattern to every frame): the decoder's biases are
    # zeroed and its codebooks drawn at unit scale, so the audio is a function of the codes.
    weights = {k: mx.zeros_like(v) if k.startswith("decoder.") and k.endswith(".bias") else v
               for k, v in _flat(codec).items()}
    weights = {k: mx.random.normal(v.shape) if k.endswith("codebook.embed.weight") else v
               for k, v in weights.items()}
    weights = _scaled(weights, "decoder.decoder.2.conv.weight", 100.0)  # the output convolution
    target = folder / "audio_tokenizer"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(target / "model.safetensors"), _stored(Qwen3TTSSpeechTokenizer.sanitize, weights))


def build_breeze(folder: Path):
    import mlx.core as mx

    from mlx_audio.tts.models.breeze_tts import Model
    from mlx_audio.tts.models.breeze_tts.config import ModelConfig

    tok = _bpe(folder, ["<pad>", "<bos>", "<eos>", "<ins_bos>", "<ins_eos>"], pad_token="<pad>",
               bos_token="<bos>", eos_token="<eos>")
    vocab = BREEZE_CODES + 3  # each codebook's codes, then Breeze's reserved pad/control ids
    small = {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    config = {
        "model_type": "breeze",
        "hidden_size": 32, "intermediate_size": 64, **small,
        "num_codebooks": BREEZE_BOOKS, "vocab_size": vocab, "text_vocab_size": len(tok),
        "codebook_pad_token_id": vocab - 1, "codebook_eos_token_id": 0,
        "backbone_config": {"hidden_size": 32, "intermediate_size": 64, **small, "rms_norm_eps": 1e-6,
                            "rope_theta": 10000.0, "max_position_embeddings": 512},
        "codec_config": {"sampling_rate": 24000, "codebook_size": BREEZE_CODES},
        "text_encoder_config": {"hidden_size": 16, "intermediate_size": 32, **small, "vocab_size": len(tok),
                                "query_pre_attn_scalar": 8, "sliding_window": 16, "eoi_token_index": len(tok)},
        "depth_decoder_config": {"hidden_size": 16, "intermediate_size": 32, **small,
                                 "num_codebooks": BREEZE_BOOKS, "vocab_size": vocab},
    }
    model = Model(ModelConfig.from_dict(config))
    weights = _flat(model)
    # One audio embedding serves both stacks (the loader copies the depth decoder's to the backbone).
    tied = weights["depth_decoder.model.embed_tokens.weight"]
    weights["backbone_model.embed_tokens.embed_audio_tokens.weight"] = tied
    # The backbone's extra end-of-speech class is silenced: the length is the recipe's max_tokens.
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = mx.concatenate([head[:-1], head[-1:] * 0.001])
    _write(folder, config, _stored(model.sanitize, weights))
    _breeze_codec(folder)


# ---------------------------------------------------------------------------------------------
# Ming-3.0 TTS tiny (lingv3_tts): a hybrid MoE backbone (Kimi delta attention and MLA layers)
# whose hidden state conditions a flow-matching DiT, one latent a step, decoded by Ming's
# audio VAE (a Qwen2 stack and an iSTFT head); flow noise seeded by generate's `seed`.

MING_SPECIALS = ["<|endoftext|>", "<audioPatch>", "<audio>", "</audio>", "<spk>", "</spk>", "<role>", "</role>"]


def _small_qwen2(vocab: int = 8) -> dict:
    return {"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}


def build_lingv3(folder: Path):
    import mlx.core as mx

    from mlx_audio.tts.models.lingv3_tts import Model

    tok = _bpe(folder, MING_SPECIALS, eos_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in MING_SPECIALS}
    latent, hop = 8, 1764  # a latent a step, 40 ms of 44.1 kHz audio each
    config = {
        "model_type": "lingv3_tts",
        # Two layers: the first Kimi delta attention with a dense MLP, the second MLA with 4 experts.
        "llm_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "layer_group_size": 2,
                       "vocab_size": len(tok), "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                       "q_lora_rank": 4, "kv_lora_rank": 4, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                       "v_head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                       "moe_shared_expert_intermediate_size": 8, "n_group": 2, "topk_group": 1,
                       "max_position_embeddings": 512, "eos_token_id": ids["<|endoftext|>"]},
        "audio_config": {"sample_rate": 44100, "patch_size": -1,
                         "enc_kwargs": {"backbone": _small_qwen2(), "input_dim": hop, "hop_size": hop,
                                        "latent_dim": latent},
                         "dec_kwargs": {"backbone": _small_qwen2(), "output_dim": hop, "latent_dim": latent}},
        "tts_config": {"latent_dim": latent, "patch_size": 1, "history_size": 1,
                       "audio_patch_token_id": ids["<audioPatch>"], "audio_start_token_id": ids["<audio>"],
                       "audio_end_token_id": ids["</audio>"], "speaker_start_token_id": ids["<spk>"],
                       "speaker_end_token_id": ids["</spk>"], "prompt_eos_token_id": ids["<|endoftext|>"],
                       "minimum_decode_steps": 1, "maximum_decode_steps": 8},
        "flow_config": {"hidden_size": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0},
        "aggregator_config": {"hidden_size": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0},
    }
    model = Model(config)
    weights = _flat(model)
    # The stop head never fires (p(stop) = 0.27 < 0.5): the length is the recipe's max_tokens.
    weights["stop_head.weight"] = mx.zeros_like(weights["stop_head.weight"])
    weights["stop_head.bias"] = mx.array([1.0, 0.0])
    # At the library's initial scale both texts give almost the same audio: the last prompt
    # tokens are the same, the flow starts from the same seeded noise and the VAE's biases add
    # the same pattern to every frame. The backbone and the flow's condition are made loud,
    # the flow's own input quiet, and the VAE decoder's biases zeroed.
    weights = _gained(weights, (("model.model.layers.", 4.0), ("c_embedder", 30.0),
                                ("flowloss.cfm.model.blocks.0.attn.", 4.0), ("final_layer", 10.0),
                                ("x_embedder", 0.2)))
    weights = {k: mx.zeros_like(v) if k.startswith("audio.decoder.") and k.endswith(".bias") else v
               for k, v in weights.items()}
    weights = _scaled(weights, "audio.decoder.head.out.weight", 0.3)  # exp(magnitude) in range
    # The iSTFT head's bias is its log-magnitude floor (then phase): +3 for a level near 0.05.
    bias = weights["audio.decoder.head.out.bias"]
    weights["audio.decoder.head.out.bias"] = mx.where(mx.arange(bias.size) < bias.size // 2, 3.0, 0.0)
    _write(folder, config, _stored(model.sanitize, weights))


# ---------------------------------------------------------------------------------------------

RECIPES: Dict[str, AudioRecipe] = {
    "kokoro": AudioRecipe(
        "kokoro", "tts", build_kokoro,
        # lang_code "e" (Spanish): misaki's G2P through espeak-ng (PyPI espeakng-loader); the
        # English codes "a"/"b" need spaCy's en_core_web_sm, which only the hub has.
        generate={"voice": "ef_dora", "lang_code": "e"},
        inputs=("Hola.", "Buenos días, amigo."),
        note="57M parameters (decoder widths fixed in code); Spanish G2P via espeak-ng",
    ),
    "kitten_tts": AudioRecipe(
        "kitten_tts", "tts", build_kitten,
        generate={"voice": "expr-voice-2-f"},
        inputs=("Hello there.", "A different sentence, longer."),
        # phonemizer looks for espeak-ng in the system (or PHONEMIZER_ESPEAK_LIBRARY and
        # PHONEMIZER_ESPEAK_DATA_PATH, which espeakng_loader's bundled copy can fill): without
        # one, generate raises "espeak not installed on your system".
        note="phonemes by phonemizer's espeak-ng backend (a system libespeak-ng or the env pointing at one)",
    ),
    "longcat_audiodit": AudioRecipe(
        "longcat_audiodit", "tts", build_longcat,
        inputs=("Hello there.", "A different sentence, longer."),
        note="flow matching seeded by generate's own seed (1024)",
    ),
    "irodori_tts": AudioRecipe(
        "irodori_tts", "tts", build_irodori,
        inputs=("Hello there.", "A different sentence, longer."),
        note="flow matching seeded by generate's rng_seed (0); fixed 12-frame length",
    ),
    "higgs_audio_v3": AudioRecipe(
        "higgs_audio_v3", "tts", build_higgs_v3,
        generate={"temperature": 0.0, "max_tokens": 16},
        inputs=("Hello there.", "A different sentence, longer."),
        note="greedy; codec fixed in code (73M parameters)",
    ),
    "breeze_tts": AudioRecipe(
        "breeze_tts", "tts", build_breeze,
        generate={"temperature": 0.0, "max_tokens": 8},
        inputs=("Hello there.", "A different sentence, longer."),
        note="greedy; the Qwen3-TTS codec at a few channels",
    ),
    "lingv3_tts": AudioRecipe(
        "lingv3_tts", "tts", build_lingv3,
        generate={"seed": 0, "max_tokens": 8},
        inputs=("Hello there.", "A different sentence, longer."),
        note="flow noise seeded by generate's seed; 8 latents (0.32 s)",
    ),
}

# Measured on this 2-core CPU with random weights at the sizes the code fixes.
_FISH_DAC = ("its codec, the Fish S1 DAC, is fixed in code (fish_s1_dac.build_ae ignores its config): "
             "469M parameters (1.9 GB float32); decoding 8 frames (0.37 s of audio) took 89 s here")
_S3GEN = ("its S3Gen token-to-wave decoder (CosyVoice flow + HiFT vocoder) takes no config: "
          "{size} parameters (~610 MB float32); 1 s of audio (25 speech tokens) took {secs} s here")
_UNSEEDED = ("generate draws its {what} noise from MLX's global generator and has no seed argument: in a "
             "fresh process that generator is seeded from the clock, so the oracle run twice gives two "
             "waveforms (reproducible only if the caller runs mx.random.seed(n) right before generate, "
             "which audio_oracle.py does not)")

NOT_BUILT: Dict[str, str] = {
    "arktts": ("its codec (ArkttsEncoder/ArkttsDecoder/ArkttsDownsampleQuantizer: 1024-wide, an 8-layer "
               "transformer, 4096- and 1024-entry codebooks) takes no size from the config: 289M parameters "
               "(1.16 GB float32); decoding 4 frames (0.19 s of 44.1 kHz audio) took 21 s here"),
    "bailingmm": _UNSEEDED.format(what="flow-matching (FlowLoss.sample)"),
    "bark": ("Model.__init__ loads BertTokenizer.from_pretrained('bert-base-multilingual-cased'): a hub id "
             "fixed in code (bark.py), not read from the model folder; and its codec is "
             "Encodec.from_pretrained(config.codec_path), a hub repo by default"),
    "chatterbox": _S3GEN.format(size="151.7M", secs=70) + "; its vocoder also draws random phase and "
                  "noise at every call (hifigan.py)",
    "chatterbox_turbo": _S3GEN.format(size="152.6M", secs="26.6 (2 meanflow steps)"),
    "confucius4": ("generate(text, ref_audio, ...) requires a reference recording (zero-shot cloning only): "
                   "with ref_audio=None it fails in load_audio, so there is no text-only synthesis; and "
                   "its sub-models (w2v-BERT, CAMPPlus, BigVGAN) load from fixed file names in fixed sizes"),
    "dense": _UNSEEDED.format(what="flow-matching (FlowLoss.sample)") + "; config {'model_type': 'dense'} "
             "with llm_config, audio_tokenizer_config, ditar_config, aggregator_config selects it",
    "dia": ("Model.__init__ runs DAC.from_pretrained('mlx-community/descript-audio-codec-44khz'): the codec "
            "comes from that hub repo, fixed in code (dia.py), never from the model folder"),
    "dramabox": ("its audio VAE (53M) and BigVGAN vocoder with bandwidth extension (129M, 1536 channels) "
                 "take no config (AudioVAE(), build_dramabox_vocoder()); the vocoder alone took 22 s for "
                 "10 mel frames (0.1 s of 48 kHz stereo) here; and its text conditioner reads 49 hidden "
                 "states of a Gemma-3 loaded by name (config text_encoder, a hub id by default)"),
    "echo_tts": _FISH_DAC,
    "fish_drama3": _FISH_DAC,
    "fish_qwen3_omni": _FISH_DAC,
    "higgs_audio": ("post_load_hook runs snapshot_download('mlx-community/higgs-audio-v2-tokenizer') for its "
                    "codec: a hub repo fixed in code (higgs_audio/model.py), never the model folder "
                    "(higgs_audio_v3, which reads audio_tokenizer/ from the folder, is built)"),
    "indextts": ("generate requires ref_audio or ref_mel (voice cloning only; ValueError without), and "
                 "samples with a fixed make_sampler(temp=0.8, top_k=30) from the unseeded global "
                 "generator unless a Python callable `sampler` is passed, which no JSON request can carry"),
    "kugelaudio": _UNSEEDED.format(what="diffusion (sample_speech_tokens, SDE-DPM-Solver++)"),
    "llama": ("importing mlx_audio.tts.models.llama runs SNAC.from_pretrained('mlx-community/snac_24khz') at "
              "module level (llama.py): without the hub the import itself fails (LocalEntryNotFoundError); "
              "config {'model_type': 'llama'} without 'acoustic_dim' selects it (with it, tada)"),
}
