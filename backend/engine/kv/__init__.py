"""Forms of a live KV cache, below everything else in the engine.

`kv_rows` the quantized and float16 cache rows that keep continuous batching
(installed into a model at load through loaders/kv_cache.py); `rewind` whether
a live cache can drop its newest tokens exactly. Imports nothing of the engine.
"""
