"""The model zoo of the family matrices: one tiny model per family the installed libraries ship.

Map:
  text_families.py    which model_types the installed mlx-lm ships (read from its files, no MLX import)
  text_configs.py     a tiny config per text family: a generic shrink plus a few per-family overrides
  text_builder.py     builds each text family's model with mlx-lm's own classes, cached per machine
  conditioning.py     makes a random-weight model decode greedily with clear margins
  tiny_tokenizer.py   a byte-level BPE trained here, a few hundred tokens (every zoo model's tokenizer)
  results.py          a matrix's results file (text.json, vision.json) and its schema
  families_doc.py     writes docs/model-families.md from the matrices' results
The vision matrix's modules (vision_*.py) sit beside these, its families' recipes in recipes/.
"""
