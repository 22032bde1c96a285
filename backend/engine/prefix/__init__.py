"""The prefix cache: finished requests' KV caches kept for later prompts.

`prompt_store` mlx-lm's LRUPromptCache in memory with files behind it;
`disk_tier` one model's folder of files and the writer that fills it;
`cache_files` the file format and the model's fingerprint; `file_checks` whether
a file is what was written (its checksums); `snapshots` copies at boundaries of
caches that cannot be cut back. Imports only the KV forms (kv/) of the rest of
the engine.
"""
