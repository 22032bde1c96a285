"""Speculative decoding of a lone stream, exact to the batch's own tokens.

`spec_batch` wraps a lane's batch: one stream running alone decodes
speculatively apart and rejoins when others arrive; `speculate` the
propose/verify loop; `ngram` prompt lookup; `spec_config` the settings and the
draft model, read at load. Imports lanes/ and kv/, never the scheduler.
"""
