"""`deepserve profile predictor`: train the decode-length bucket classifier on traces with
scikit-learn (a shallow decision tree: interpretable, and exported as plain arrays the JE
evaluates without the library) and report its accuracy on a held-out split — the last 20% of
each trace in arrival order, so the test requests come after every training request, as they
would in production.

Features are what a scheduler sees at arrival (actors/scheduling/predictor.py): the prompt
length and the prompt prefix seen before in the same trace (Mooncake's hash_ids; Azure publishes
no sharing, so 0), computed in arrival order like the JE's global prompt tree would.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from deepserve.actors.scheduling.predictor import FEATURES, DecodeLengthTree, bucket_of, features
from deepserve.adapters.scenario.loader import trace_path
from deepserve.adapters.traces import open_trace
from deepserve.adapters.traces.prompts import MOONCAKE_BLOCK_TOKENS

HELD_OUT = 0.2


def trace_rows(trace: str, limit: int | None = None) -> list[tuple[tuple[float, float, float], int]]:
    """(features, bucket) per request in arrival order."""
    seen: set[int] = set()
    rows = []
    for r in open_trace(trace_path(trace)).head(limit):
        prefix = 0
        if r.hash_ids is not None:
            # Chain semantics: block k is shared only if blocks 0..k are (the ids name prefixes).
            for h in r.hash_ids:
                if h not in seen:
                    break
                prefix += 1
            seen.update(r.hash_ids)
        rows.append((features(r.prompt_tokens, prefix * MOONCAKE_BLOCK_TOKENS), bucket_of(r.output_tokens)))
    return rows


def train(traces: tuple[str, ...], max_depth: int = 8, limit: int | None = None, seed: int = 0) -> dict[str, Any]:
    from sklearn.tree import DecisionTreeClassifier

    train_x, train_y, test = [], [], []
    for t in traces:
        rows = trace_rows(t, limit)
        cut = int(len(rows) * (1 - HELD_OUT))
        train_x += [x for x, _ in rows[:cut]]
        train_y += [y for _, y in rows[:cut]]
        test.append((t, rows[cut:]))
    if len(set(train_y)) < 2:
        raise ValueError("--trace: the training split needs at least two decode-length buckets")
    clf = DecisionTreeClassifier(max_depth=max_depth, min_samples_leaf=20, random_state=seed)
    clf.fit(train_x, train_y)
    fitted: Any = clf.tree_
    buckets = [int(clf.classes_[v.argmax()]) for v in fitted.value[:, 0, :]]
    tree = DecodeLengthTree(
        feature=tuple(int(f) if f >= 0 else 0 for f in fitted.feature),
        threshold=tuple(float(v) for v in fitted.threshold),
        left=tuple(int(c) for c in fitted.children_left), right=tuple(int(c) for c in fitted.children_right),
        bucket=tuple(buckets), trained_on=tuple(traces),
    )  # fmt: skip
    majority = Counter(train_y).most_common(1)[0][0]
    report = []
    hits = total = base = 0
    for name, rows in test:
        ok = sum(tree.predict(x) == y for x, y in rows)
        b = sum(majority == y for _, y in rows)
        report.append({"trace": name, "held_out": len(rows), "accuracy": ok / max(len(rows), 1),
                       "majority_baseline": b / max(len(rows), 1)})
        hits, total, base = hits + ok, total + len(rows), base + b
    acc = hits / max(total, 1)
    import msgspec

    tree = msgspec.structs.replace(tree, accuracy_held_out=acc)
    return {"predictor": msgspec.to_builtins(tree), "features": list(FEATURES), "accuracy_held_out": acc,
            "majority_baseline": base / max(total, 1), "per_trace": report, "train_requests": len(train_y),
            "max_depth": max_depth}
