"""Model loaders: they run on the loader thread and hand the engine a ready model.

`loaded` holds what every loader builds: the loaded model, its load request and
the two load errors. `model_loader` resolves and routes by the model's files: mlx-lm (text), GGUF
conversion (`gguf_convert`, kept by `gguf_loader`), mlx-vlm (`vision_model`), encoders for embeddings
(`embed_loader`) and reranking (`cross_encoder`); then the adaptations asked
for at load (`adapt_options`): LoRA (`adapters`), the KV cache's form
(`kv_cache`: installed and measured; its classes are the engine's, `kv_rows`), and the encoders' fast GELU (`fast_gelu`). Loaders never import
the engine, the servicer (backend.py) or request preparation (prepare.py).
"""
