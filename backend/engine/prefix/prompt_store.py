"""The prefix cache in two tiers: mlx-lm's LRUPromptCache in memory, files on disk.

`PromptStore` is mlx-lm's LRUPromptCache (same calls: fetch_nearest_cache,
insert_cache with its cache_type, nbytes, trim_to, len) with a `DiskTier`
behind it. What memory evicts, and what it still holds when the batch closes
(a model swap, the shutdown), goes to disk; a prompt that memory serves no
better than disk is served from the longest file whose tokens it extends (or,
for a cache that can be trimmed, shares a prefix with), read back into memory.

The files and their fingerprint: engine/prefix/cache_files.py; the folder, its index, its
budget and the writer thread: engine/prefix/disk_tier.py.

Engine thread, but the figures (`figures`) are read by any thread.
"""

import logging
from typing import Any, Dict, List, Optional, Tuple

from mlx_lm.models.cache import LRUPromptCache, PromptTrie, can_trim_prompt_cache, trim_prompt_cache

from engine.prefix import snapshots
from engine.prefix.cache_files import fingerprint
import store
from engine.prefix.disk_tier import DiskTier

log = logging.getLogger("mlx-backend.prompt-store")

# ---- the two tiers together ------------------------------------------------------


class _EvictionTrie(PromptTrie):
    """mlx-lm's trie, noting what LRUPromptCache evicts (its only use of `pop`)."""

    def __init__(self):
        super().__init__()
        self.evicted: List[Tuple[Any, List[int], Any]] = []

    def pop(self, model, tokens):
        entry = super().pop(model, tokens)
        self.evicted.append((model, tokens, entry))
        return entry


class PromptStore(LRUPromptCache):
    """LRUPromptCache with a disk tier behind it (`disk` None: memory only, as before)."""

    def __init__(self, max_size: int = 10, max_bytes: int = 1 << 63, disk: Optional[DiskTier] = None):
        super().__init__(max_size=max_size, max_bytes=max_bytes)
        self._trie = _EvictionTrie()
        self.disk = disk
        self.hits = {"memory": 0, "disk": 0}
        self.tokens_saved = 0
        self.source = "memory"  # where the last fetch's cache came from
        # Rank 0 of a group: the token keys its bounds evicted, for the other ranks to evict too
        # (engine/lockstep/recording.py); None: not noted.
        self.dropped: Optional[List[List[int]]] = None

    def fetch_nearest_cache(self, model, tokens):
        cache, rest = super().fetch_nearest_cache(model, tokens)
        served = len(tokens) - len(rest) if cache is not None else 0
        self.source = "memory"
        if self.disk is not None and served < len(tokens):
            if self._load_from_disk(model, tokens, served):
                again, again_rest = super().fetch_nearest_cache(model, tokens)
                if again is not None and len(tokens) - len(again_rest) > served:
                    cache, rest, self.source = again, again_rest, "disk"
        return cache, rest

    def nearest(self, model, key: List[Any]) -> Tuple[Any, List[Any]]:
        """The longest cached prefix of `key` and the rest to prefill (at least one token, for
        the logits: a wholly cached prompt recomputes its last token), counted as a hit."""
        cache, rest = self.fetch_nearest_cache(model, key)
        if cache is not None and not rest:
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = key[-1:]
            else:  # the longest entry short of the whole key: an end-of-prompt snapshot is one
                cache, rest = self.fetch_nearest_cache(model, key[:-1])
                rest = list(rest) + key[-1:]
        self.count_hit(len(key) - len(rest) if cache is not None else 0)
        return cache, rest

    def keep_snapshot(self, model, tokens: List[int], cache: List[Any], prompt_length: int) -> None:
        """A snapshot taken during a prompt's prefill, accounted and evicted with every other
        entry. Losing one must not fail the request."""
        kind = snapshots.END_OF_PROMPT if len(tokens) == prompt_length - 1 else snapshots.SHARED_PREFIX
        try:
            self.insert_cache(model, tokens, cache, cache_type=kind)
        except Exception:
            log.exception("keeping a %d-token snapshot failed", len(tokens))

    def count_hit(self, tokens: int) -> None:
        """A prompt started from the last fetch's cache with `tokens` of it (what the caller used:
        a whole-prompt hit gives back its last token, a second fetch may follow a first)."""
        if tokens > 0:
            self.hits[self.source] += 1
            self.tokens_saved += tokens

    def _load_from_disk(self, model, tokens, served: int) -> bool:
        try:
            best = self.disk.best(list(tokens), served)
            if best is None:
                return False
            got = self.disk.read(best[0])
        except Exception:  # the disk tier never fails a request: it only serves less
            log.exception("prompt cache: disk lookup failed")
            return False
        if got is None:
            return False
        entry_tokens, cache, cache_type = got
        self.insert_cache(model, entry_tokens, cache, cache_type=cache_type)
        return True

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type: str = "assistant"):
        super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
        self._spill()

    def trim_to(self, *, n_sequences=None, n_bytes=None):
        super().trim_to(n_sequences=n_sequences, n_bytes=n_bytes)
        self._spill()

    def drop(self, model, tokens: List[int]) -> None:
        """Evict the entry of `tokens` (if held) as another store evicted it: a follower's store
        has no bounds of its own and evicts what rank 0's bounds evicted, so both hold the same
        keys whatever the bytes each rank's share of an entry weighs."""
        try:
            entry = self._trie.pop(model, tokens)
        except KeyError:
            return
        finally:
            self._trie.evicted = []
        self._lru.remove(model, tokens)
        self._n_bytes -= entry.nbytes
        self._n_bytes_by_type[entry.cache_type] -= entry.nbytes

    def _spill(self) -> None:
        """What memory just evicted goes to disk (and, on rank 0 of a group, to the other ranks)."""
        evicted, self._trie.evicted = self._trie.evicted, []
        if self.dropped is not None:
            self.dropped += [list(tokens) for _, tokens, _ in evicted]
        if self.disk is None:
            return
        for _, tokens, entry in evicted:
            self._to_disk(tokens, entry.prompt_cache, entry.cache_type)

    def _to_disk(self, tokens, cache, cache_type) -> None:
        try:
            self.disk.save(list(tokens), cache, cache_type)
        except Exception:
            log.exception("prompt cache: queueing a disk write failed")

    def flush_to_disk(self) -> int:
        """Queue every entry still in memory for the disk, most recently used first (the batch
        closes: a model swap, the shutdown). How many were queued."""
        if self.disk is None:
            return 0
        queued = 0
        recent = []
        for cache_type in self._lru._ordering:
            recent.extend(reversed(self._lru._lrus[cache_type]))
        for model, tokens in recent:
            try:
                entry = self._trie.get(model, tokens)
            except KeyError:
                continue
            self._to_disk(tokens, entry.prompt_cache, entry.cache_type)
            queued += 1
        return queued

    def figures(self) -> Dict[str, int]:
        """For Status: entries, bytes, hits and prompt tokens served from the cache."""
        out = {"prompt_cache_entries": len(self), "prompt_cache_hits_memory": self.hits["memory"],
               "prompt_cache_hits_disk": self.hits["disk"], "prompt_cache_tokens_saved": self.tokens_saved}
        if self.disk is not None:
            out.update(prompt_cache_disk_entries=self.disk.entries,
                       prompt_cache_disk_bytes=self.disk.writer.disk_bytes,
                       prompt_cache_disk_files=self.disk.writer.disk_files)
        return out


# The kinds of model whose prefix cache goes to disk. A vision model's entries are keyed by
# the prompt with its media tokens replaced by content hashes (media.keyed_tokens), and the
# fingerprint holds its processor files and frame sampling: a file matches only the same
# images in the same prompt, as in memory. An entry whose cache holds a class the file
# format cannot rebuild (mlx-vlm's own cache classes, which some of its language models
# make) stays in memory only (DiskTier.save refuses it). Embedding and reranking models
# keep no prefix cache.
DISK_KINDS = ("text", "vision")


def make_store(lm, max_size: int, max_bytes: int, disk_bytes: int) -> PromptStore:
    """The prefix cache of `lm`: a disk tier when `disk_bytes` > 0 and its folders can be the
    store's (this user's alone: store.py); else memory only, the fault logged and counted."""
    disk = None
    if disk_bytes > 0 and getattr(lm, "kind", "text") in DISK_KINDS:
        root = store.PROMPTS.folder()
        if root is not None:
            try:
                disk = DiskTier(root, fingerprint(lm), disk_bytes)
                # The folder's name is a hash: this line is how an operator finds one model's files.
                log.info("prompt cache: the files of %s are in %s", lm.source, disk.folder)
            except OSError as e:
                store.PROMPTS.miss("using a model's folder (the disk tier is off)", e)
    return PromptStore(max_size=max_size, max_bytes=max_bytes, disk=disk)

