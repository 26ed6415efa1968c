"""The decode-length predictor's runtime half (DeepServe §5.3.3): a decision tree classifying a
request's decode length into 128-token buckets, evaluated as plain data (no library at runtime,
deterministic, cheap). `deepserve profile predictor` trains it with scikit-learn on traces and
writes the tree; the JE loads it and records the bucket in each decision.

Features are only what a scheduler sees at arrival (`features`): the prompt length and how much
of the prompt the cluster has seen before (the global prompt tree's longest match, a multi-turn
conversation's history) — never the output.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import msgspec

from .decision import DECODE_BUCKET_TOKENS

FEATURES = ("log2_prompt_tokens", "seen_prefix_fraction", "log2_seen_prefix_tokens")
MAX_BUCKET = 31  # outputs of 4,096 tokens and more share the last bucket


def bucket_of(output_tokens: int) -> int:
    return min(max(output_tokens - 1, 0) // DECODE_BUCKET_TOKENS, MAX_BUCKET)


def features(prompt_tokens: int, seen_prefix_tokens: int) -> tuple[float, float, float]:
    seen = min(seen_prefix_tokens, prompt_tokens)
    return (math.log2(max(prompt_tokens, 1)), seen / max(prompt_tokens, 1), math.log2(seen + 1))


class DecodeLengthTree(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """sklearn's tree_ arrays: node k tests feature[k] <= threshold[k] (left) else right; a leaf
    (left[k] == -1) answers bucket[k]."""

    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    bucket: tuple[int, ...]
    accuracy_held_out: float = math.nan
    trained_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.feature)
        if n == 0 or any(len(a) != n for a in (self.threshold, self.left, self.right, self.bucket)):
            raise ValueError("predictor: feature, threshold, left, right, bucket must have one entry per node")
        if any(not -1 <= c < n for c in self.left + self.right):
            raise ValueError("predictor: a child index is out of range")

    def predict(self, x: tuple[float, ...]) -> int:
        k = 0
        for _ in range(len(self.feature)):  # a bound: a malformed tree cannot loop forever
            if self.left[k] == -1:
                return self.bucket[k]
            k = self.left[k] if x[self.feature[k]] <= self.threshold[k] else self.right[k]
        raise ValueError("predictor: the tree has a cycle")


def bucket_memo(tree: DecodeLengthTree, block_tokens: int) -> Callable[[int, int], int]:
    """`tree`'s bucket for (prompt tokens, prompt blocks the cluster holds), kept for the 4,096
    pairs last asked: a pure function of the two, and a request's arrival asks it every time."""

    @functools.lru_cache(maxsize=4096)
    def bucket(prompt_tokens: int, seen_blocks: int) -> int:
        return tree.predict(features(prompt_tokens, seen_blocks * block_tokens))

    return bucket
