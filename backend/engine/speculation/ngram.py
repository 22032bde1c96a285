"""Prompt lookup: propose the next tokens by finding the text so far earlier in the context.

Pure Python (no MLX). When a model quotes its input (code edits, answers
from a retrieved passage, summaries) the last few tokens it wrote usually
appeared before, followed by what it is about to write. The index keeps, for
every n-gram of the sizes in use, where its latest occurrence that already has
a follower ends, so a proposal costs a few dictionary look-ups per step
whatever the context length.
"""

from typing import Dict, List, Sequence, Tuple


class NgramIndex:
    """The context (prompt + generated tokens) and its n-gram positions.

    `ends[n][gram] = j` means context[j - n:j] == gram and j < len(context):
    the latest occurrence of `gram` that is followed by a token.
    """

    def __init__(self, tokens: Sequence[int] = (), max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}..{max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: List[int] = []
        self.ends: Dict[int, Dict[Tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            j = len(self.tokens) - 1  # the grams ending just before the new token now have a follower
            for n, table in self.ends.items():
                if j >= n:
                    table[tuple(self.tokens[j - n:j])] = j

    def propose(self, k: int) -> List[int]:
        """Up to `k` tokens that followed the longest earlier match of the context's tail."""
        if k <= 0:
            return []
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            j = self.ends[n].get(tuple(self.tokens[size - n:]))
            if j is not None:
                return self.tokens[j:j + k]
        return []
