"""A tiny random-weight BERT cross-encoder (BertForSequenceClassification, one label).

No real cross-encoder installs offline. The weights are mlx-vlm's own BERT
sequence-classification model at random init (seeded), saved under the names
mlx-vlm's loader reads back; the tokenizer (BERT WordPiece, 30522 tokens) is
all-MiniLM-L6-v2's, so queries and documents tokenize as real text does.
Random weights still make a deterministic function of (query, document): enough to
compare our server with mlx-vlm's own scoring of the same checkpoint.
"""

import json
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build(target: Path, width: int = 32, layers: int = 2, max_positions: int = 128) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import bert

    from models import minilm_dir

    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(minilm_dir()) / name, target / name)
    config = {
        "model_type": "bert", "architectures": ["BertForSequenceClassification"],
        "vocab_size": 30522, "hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": 2,
        "intermediate_size": 2 * width, "max_position_embeddings": max_positions, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "pad_token_id": 0, "hidden_act": "gelu",
        "num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    }
    (target / "config.json").write_text(json.dumps(config, indent=1))
    mx.random.seed(0)
    model = bert.SequenceClassificationModel(bert.ModelConfig.from_dict(config))
    # At the default init scale every pair gets almost the same logit; larger matrices spread
    # the scores, so an order and a swapped query/document are visible.
    weights = {k: v * 4 if v.ndim >= 2 else v for k, v in tree_flatten(model.parameters())}
    # Hugging Face's names (a `bert.` prefix on the body): the loader's sanitize strips it.
    weights = {k if k.startswith("classifier.") else f"bert.{k}": v for k, v in weights.items()}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    return target


_built = {}


def tiny_cross_encoder(num_labels: int = 1) -> str:
    """The fixture directory, built once per process in a temporary folder; with
    `num_labels` other than 1, the same model claiming that many labels (refused)."""
    if num_labels not in _built:
        root = Path(tempfile.mkdtemp(prefix="tiny-cross-encoder-"))
        target = build(root / "tiny-cross-encoder")
        if num_labels != 1:
            config = json.loads((target / "config.json").read_text())
            config["num_labels"] = num_labels
            config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
            (target / "config.json").write_text(json.dumps(config, indent=1))
        _built[num_labels] = str(target)
    return _built[num_labels]
