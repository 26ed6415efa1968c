"""The decode-length predictor: the runtime tree walk on a hand-built tree, the features, and a
trained tree that agrees with scikit-learn's own predictions and beats the majority class."""

from __future__ import annotations

import pytest

from deepserve.actors.scheduling.predictor import DecodeLengthTree, bucket_of, features


def test_bucket_of_is_128_token_buckets_capped() -> None:
    assert [bucket_of(n) for n in (1, 128, 129, 256, 257, 10**6)] == [0, 0, 1, 1, 2, 31]


def test_features_are_known_at_arrival_only() -> None:
    assert features(1024, 512) == (10.0, 0.5, pytest.approx(9.0028, abs=1e-4))
    assert features(100, 10**6)[1] == 1.0  # a seen prefix never exceeds the prompt


def test_hand_built_tree_walk() -> None:
    # root: log2 prompt <= 10 ? leaf bucket 3 : (seen fraction <= 0.5 ? bucket 0 : bucket 7)
    t = DecodeLengthTree(feature=(0, 0, 1, 0, 0), threshold=(10.0, -2, 0.5, -2, -2),
                         left=(1, -1, 3, -1, -1), right=(2, -1, 4, -1, -1), bucket=(0, 3, 0, 0, 7))
    assert t.predict(features(512, 0)) == 3
    assert t.predict(features(4096, 0)) == 0
    assert t.predict(features(4096, 4000)) == 7
    with pytest.raises(ValueError, match="child index"):
        DecodeLengthTree(feature=(0,), threshold=(1.0,), left=(5,), right=(-1,), bucket=(0,))


def test_trained_tree_reproduces_its_reported_accuracy_and_beats_the_majority_class() -> None:
    pytest.importorskip("sklearn")
    from deepserve.benchmarks.predictor import trace_rows, train

    data = train(("builtin:azure_conv_500", "builtin:mooncake_conv_1k"), max_depth=4)
    tree = DecodeLengthTree(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["predictor"].items()})
    assert data["accuracy_held_out"] == tree.accuracy_held_out
    assert data["accuracy_held_out"] > data["majority_baseline"]
    rows = trace_rows("builtin:azure_conv_500")
    cut = int(len(rows) * 0.8)
    acc = sum(tree.predict(x) == y for x, y in rows[cut:]) / len(rows[cut:])
    assert acc == data["per_trace"][0]["accuracy"]
