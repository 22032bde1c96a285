"""Tiny random-weight cross-encoders (BERT, XLM-R or ModernBERT ForSequenceClassification, one label).

No real cross-encoder installs offline. The weights are mlx-vlm's own
sequence-classification model at random init (seeded), saved under the
Hugging Face names mlx-vlm's loader reads back; the tokenizer (BERT WordPiece,
30522 tokens) is all-MiniLM-L6-v2's, so queries and documents tokenize as real
text does. The XLM-R and ModernBERT variants keep that tokenizer but, like their
own, it gives no token_type_ids (XLM-R has one segment embedding, ModernBERT
none); the ModernBERT one mean-pools (padding must not count) and attends
locally in a window shorter than a pair.
Random weights still make a deterministic function of (query, document): enough to
compare our server with mlx-vlm's own scoring of the same checkpoint.
"""

import json
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# model_type -> (architecture, mlx-vlm module, the body's name in Hugging Face checkpoints)
KINDS = {"bert": ("BertForSequenceClassification", "bert", "bert"),
         "xlm-roberta": ("XLMRobertaForSequenceClassification", "xlm_roberta", "roberta"),
         "modernbert": ("ModernBertForSequenceClassification", "modernbert", "model")}


def build(target: Path, model_type: str = "bert", width: int = 32, layers: int = 2,
          max_positions: int = 128) -> Path:
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from models import minilm_dir

    target.mkdir(parents=True, exist_ok=True)
    architecture, module_name, body = KINDS[model_type]
    xlmr = model_type == "xlm-roberta"
    for name in TOKENIZER_FILES:
        shutil.copy(Path(minilm_dir()) / name, target / name)
    if model_type != "bert":  # a tokenizer without segments, as theirs
        tok_config = json.loads((target / "tokenizer_config.json").read_text())
        tok_config["model_input_names"] = ["input_ids", "attention_mask"]
        (target / "tokenizer_config.json").write_text(json.dumps(tok_config))
    config = {
        "model_type": model_type, "architectures": [architecture],
        "vocab_size": 30522, "hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": 2,
        "intermediate_size": 2 * width, "type_vocab_size": 1 if xlmr else 2,
        # XLM-R counts positions from after the padding id (the tokenizer's [PAD], 0, here).
        "max_position_embeddings": max_positions + (2 if xlmr else 0),
        "layer_norm_eps": 1e-5 if xlmr else 1e-12, "pad_token_id": 0, "hidden_act": "gelu",
        "num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    }
    if model_type == "modernbert":
        config.update(global_attn_every_n_layers=2, local_attention=8, classifier_pooling="mean",
                      norm_eps=1e-5, max_position_embeddings=max_positions)
    (target / "config.json").write_text(json.dumps(config, indent=1))
    module = importlib.import_module(f"mlx_vlm.models.{module_name}")
    mx.random.seed(0)
    model = module.SequenceClassificationModel(module.ModelConfig.from_dict(config))
    # At the default init scale every pair gets almost the same logit; larger matrices spread
    # the scores, so an order and a swapped query/document are visible.
    weights = {k: v * 4 if v.ndim >= 2 else v for k, v in tree_flatten(model.parameters())}
    # Hugging Face's names (`bert.` / `roberta.` before the body): the loader's sanitize strips it.
    weights = {k if k.startswith(("classifier.", "head.")) else f"{body}.{k}": v for k, v in weights.items()}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    return target


_built = {}


def tiny_cross_encoder(model_type: str = "bert", num_labels: int = 1) -> str:
    """The fixture directory, built once per process in a temporary folder; with
    `num_labels` other than 1, the same model claiming that many labels (refused)."""
    key = (model_type, num_labels)
    if key not in _built:
        root = Path(tempfile.mkdtemp(prefix="tiny-cross-encoder-"))
        target = build(root / "tiny-cross-encoder", model_type)
        if num_labels != 1:
            config = json.loads((target / "config.json").read_text())
            config["num_labels"] = num_labels
            config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
            (target / "config.json").write_text(json.dumps(config, indent=1))
        _built[key] = str(target)
    return _built[key]
