"""The model zoo of the family matrices: one tiny model per family the installed libraries ship.

Map:
  tiny_tokenizer.py   a byte-level BPE trained here, a few hundred tokens (every zoo model's tokenizer)
  text_families.py    which model_types the installed mlx-lm ships (read from its files, no MLX import)
  text_configs.py     a tiny config per text family: a generic shrink plus a few per-family overrides
  text_builder.py     builds, conditions and caches each text family's model with mlx-lm's own classes
  families_doc.py     writes docs/model-families.md from the matrices' results (text.json, vision.json)
The vision matrix's modules (vision_*.py) sit beside these.
"""
