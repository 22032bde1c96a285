"""The vad families' recipes: the models that say where in a clip there is speech.

The server's VAD RPC answers one question, "where is speech" (segments in seconds), so only
the voice-activity families get a model here:
- silero_vad: the real Silero VAD (both its 16 kHz and 8 kHz branches), converted from the
  ONNX export that the `silero-vad` package ships into mlx-audio's layout. It needs
  `silero-vad` (installed without its dependencies: they are torch) and `onnx` to build.
- fsmn: FunASR's FSMN-VAD at its real size with seeded random weights, plus one hand-set
  path through every layer that makes the silence score fall with the frame's energy, so
  the segments it finds follow the voiced stretches of the clip.
Diarization (sortformer, nemotron_diarization) and end-of-turn (smart_turn) models answer
other questions; NOT_BUILT says what each returns instead.
"""

import dataclasses
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Dict

import mlx.core as mx
import numpy as np

from zoo.audio.recipe import AudioRecipe

# The clips the matrix sends: audio_clips.clip(seed, seconds).
CLIPS = ((1, 4.0), (2, 4.0))

# --- silero_vad -------------------------------------------------------------------------

# The weights come from this release only: the builder's folder name hashes this module, not
# the installed package, so a different release must be a change here too.
SILERO_RELEASE = "6.2.3"

# Silero hears the clips' synthetic harmonics mostly as non-speech: its probabilities rise
# only at the stretches' onsets (peaks 0.77 and 0.93 over the two clips). At its own
# defaults (0.5, 250 ms) clip 1 has no segment; at these both clips have two, each starting
# at a voiced stretch's onset, and none moves when every probability is shifted by +-0.005.
# They are written as the model's own defaults (config.json) because the VAD request
# carries only samples.
SILERO_DEFAULTS = {"threshold": 0.2, "min_speech_duration_ms": 50,
                   "min_silence_duration_ms": 100, "speech_pad_ms": 30}


def _silero_onnx() -> Path:
    """The ONNX file inside the installed silero-vad package (found, not imported: the
    package's __init__ imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"silero_vad needs the silero-vad package: pip install --no-deps silero-vad=={SILERO_RELEASE}",
            name="silero_vad")
    release = importlib.metadata.version("silero-vad")
    if release != SILERO_RELEASE:
        raise RuntimeError(f"silero_vad is converted from silero-vad {SILERO_RELEASE}, found {release}")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"


def _onnx_branches(path: Path):
    """The tensors of each branch of the export's sample-rate switch, by their PyTorch names.

    The export keeps one copy of the network per rate under a top-level If node; each
    branch holds its weights as Constant nodes named "<branch prefix>__<parameter name>".
    """
    import onnx
    from onnx import numpy_helper

    switch = next(node for node in onnx.load(str(path)).graph.node if node.op_type == "If")
    branches = []
    for attribute in switch.attribute:
        tensors = {}
        for node in attribute.g.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                tensors[node.output[0].rsplit("__", 1)[-1]] = numpy_helper.to_array(node.attribute[0].t)
        branches.append(tensors)
    return branches


def _conv(weight: np.ndarray) -> np.ndarray:
    """PyTorch's Conv1d weight (out, in, kernel) in MLX's order (out, kernel, in)."""
    return np.ascontiguousarray(weight.transpose(0, 2, 1))


def _silero_branch(tensors: Dict[str, np.ndarray], prefix: str) -> Dict[str, np.ndarray]:
    """One branch's weights under mlx-audio's SileroVADBranch names."""
    out = {f"{prefix}.stft_conv.weight": _conv(tensors["stft.forward_basis_buffer"])}
    for i in range(4):  # encoder.0..3 are conv1..conv4
        out[f"{prefix}.conv{i + 1}.weight"] = _conv(tensors[f"encoder.{i}.reparam_conv.weight"])
        out[f"{prefix}.conv{i + 1}.bias"] = tensors[f"encoder.{i}.reparam_conv.bias"]
    # Both LSTMs order the gates i, f, g, o; MLX's has one bias where PyTorch's has two.
    out[f"{prefix}.lstm.Wx"] = tensors["decoder.rnn.weight_ih"]
    out[f"{prefix}.lstm.Wh"] = tensors["decoder.rnn.weight_hh"]
    out[f"{prefix}.lstm.bias"] = tensors["decoder.rnn.bias_ih"] + tensors["decoder.rnn.bias_hh"]
    out[f"{prefix}.final_conv.weight"] = _conv(tensors["decoder.decoder.2.weight"])
    out[f"{prefix}.final_conv.bias"] = tensors["decoder.decoder.2.bias"]
    return out


def build_silero(folder: Path) -> None:
    from mlx_audio.vad.models.silero_vad import Model, ModelConfig

    config = ModelConfig(**SILERO_DEFAULTS)
    prefixes = {config.branch_16k.filter_length: "vad_16k", config.branch_8k.filter_length: "vad_8k"}
    weights = {}
    for tensors in _onnx_branches(_silero_onnx()):
        # A branch is told by its STFT window (256 samples at 16 kHz, 128 at 8 kHz), not by
        # its place in the If node.
        prefix = prefixes[tensors["stft.forward_basis_buffer"].shape[-1]]
        weights.update(_silero_branch(tensors, prefix))
    arrays = {k: mx.array(v.astype(np.float32)) for k, v in weights.items()}
    Model(config).load_weights(list(arrays.items()), strict=True)  # every name and shape fits
    mx.save_safetensors(str(folder / "model.safetensors"), arrays)
    (folder / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))


# --- fsmn --------------------------------------------------------------------------------

# The frame's mean log-mel level (Kaldi fbank of the waveform times 2**15) is about 12.8 in
# the clips' quiet floor and 15 to 17 inside a voiced stretch: the level the CMVN centres on.
FSMN_LEVEL = 13.8
# Silence logit: FSMN_SILENCE when the centred level is <= 0, falling by FSMN_SLOPE per unit
# above it. Against 247 other logits near 0 the silence probability goes from 0.92 to below
# the postprocess's speech line (0.2, from speech_noise_thres 0.6) 0.4 units above the level.
FSMN_SILENCE = 8.0
FSMN_SLOPE = 10.0
# FunASR's 800 ms end silence would bridge the clips' 0.15-0.5 s gaps into one segment.
FSMN_END_SILENCE_MS = 300


def _pick(linear, row: int, column: int, gain: float = 1.0) -> None:
    """Make output `row` of `linear` read input `column` alone (times `gain`, no bias)."""
    weight = np.array(linear.weight)
    weight[row] = 0.0
    weight[row, column] = gain
    linear.weight = mx.array(weight)
    if "bias" in linear:
        bias = np.array(linear.bias)
        bias[row] = 0.0
        linear.bias = mx.array(bias)


def _shape_fsmn(encoder) -> None:
    """Carry the frame's centred level on unit 0 of every layer to the silence logit.

    Everything else keeps its random weights; the ReLUs on the way keep only the level above
    FSMN_LEVEL, so quiet frames give the full silence logit and voiced frames a low one.
    """
    weight = np.array(encoder.in_linear1.weight)
    weight[0] = 1.0 / weight.shape[1]  # the mean over the 5 stacked frames x 80 mels
    encoder.in_linear1.weight = mx.array(weight)
    bias = np.array(encoder.in_linear1.bias)
    bias[0] = 0.0
    encoder.in_linear1.bias = mx.array(bias)
    _pick(encoder.in_linear2, 0, 0)
    for layer in encoder.fsmn:
        _pick(layer.linear, 0, 0)
        memory = np.array(layer.fsmn_block.conv_left.weight)
        memory[0] = 0.0  # no memory on this channel: the block passes it through as it is
        layer.fsmn_block.conv_left.weight = mx.array(memory)
        _pick(layer.affine, 0, 0)
    _pick(encoder.out_linear1, 0, 0)
    # The other 247 logits are random but small, so the silence logit alone decides.
    weight = np.array(encoder.out_linear2.weight) * 0.1
    bias = np.array(encoder.out_linear2.bias) * 0.1
    weight[0] = 0.0
    weight[0, 0] = -FSMN_SLOPE
    bias[0] = FSMN_SILENCE
    encoder.out_linear2.weight = mx.array(weight)
    encoder.out_linear2.bias = mx.array(bias)


def build_fsmn(folder: Path) -> None:
    from mlx.utils import tree_flatten
    from mlx_audio.vad.models.fsmn import Model, ModelConfig

    config = ModelConfig(max_end_silence_time=FSMN_END_SILENCE_MS)
    model = Model(config)  # real size (400 -> 248, 4 FSMN layers), seeded by the builder
    _shape_fsmn(model.encoder)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    # Read by the family's post_load_hook: features become (fbank + shift) * scale.
    dims = config.encoder.input_dim
    (folder / "cmvn.json").write_text(json.dumps({"shift": [-FSMN_LEVEL] * dims, "scale": [1.0] * dims}))


RECIPES = {
    "silero_vad": AudioRecipe(
        family="silero_vad", kind="vad", build=build_silero, inputs=CLIPS,
        note="real Silero VAD 6.2.3 weights (16 and 8 kHz), converted from its ONNX export; "
             "threshold 0.2, min speech 50 ms in config.json: it hears the synthetic clips mostly as non-speech"),
    "fsmn": AudioRecipe(
        family="fsmn", kind="vad", build=build_fsmn, inputs=CLIPS,
        note="real-size FSMN-VAD, seeded random weights with a frame-energy path to the silence score; "
             "end silence 300 ms; the family has detect(), not generate(): segments in ms, 16 kHz only"),
}

NOT_BUILT = {
    "smart_turn": "not voice activity: an end-of-turn detector; it has no generate, and its "
                  "predict_endpoint returns one EndpointOutput(prediction 0/1, probability) for the last "
                  "8 s of the input (has the speaker finished their turn?), with no time spans",
    "sortformer": "not voice activity: speaker diarization; generate returns a DiarizationOutput whose "
                  "segments are (start, end in seconds, speaker 0-3), one run per speaker, overlapping where "
                  "speakers overlap, and no timestamps; speech is only their union, a merge the VAD answer "
                  "would have to invent for this family",
    "nemotron_diarization": "not voice activity: speaker diarization (up to 8 speakers, streamed); generate "
                            "returns a DiarizationOutput of per-speaker (start, end in seconds, speaker) "
                            "segments that overlap where speakers overlap, and no timestamps; speech is only "
                            "their union, a merge the VAD answer would have to invent for this family",
}
