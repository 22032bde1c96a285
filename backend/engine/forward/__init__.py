"""Forward-only work: embeddings, candidate scores, cross-encoder pairs.

`passes` the jobs and their bounded chunks between decode steps (the scheduler
drives them as its other kind of Work: engine/forward_queue.py); `score_rows` a
score job's rows over the shared prompt's cache; `pair_forward` (query,
document) pairs; `row_batch` which inputs share a padded pass. Imports prefix/
(a score reads and fills the prefix cache), never lanes, speculation, lockstep
or the scheduler.
"""
