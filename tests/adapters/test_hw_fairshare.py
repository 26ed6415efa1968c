"""Max-min fair sharing and completion times of concurrent flows."""

import pytest

from deepserve.adapters.hardware.fairshare import Flow, completion_times_s, max_min_rates


def test_single_link_is_split_evenly():
    assert max_min_rates({"a": 9.0}, {"x": ["a"], "y": ["a"], "z": ["a"]}) == pytest.approx(
        {"x": 3.0, "y": 3.0, "z": 3.0}
    )


def test_bottlenecked_flow_leaves_the_rest_to_others():
    rates = max_min_rates({"a": 10.0, "b": 2.0}, {"long": ["a", "b"], "short": ["a"]})
    assert rates == pytest.approx({"long": 2.0, "short": 8.0})


def test_classic_parking_lot():
    caps = {"l1": 10.0, "l2": 10.0}
    flows = {"through": ["l1", "l2"], "one": ["l1"], "two": ["l2"]}
    assert max_min_rates(caps, flows) == pytest.approx({"through": 5.0, "one": 5.0, "two": 5.0})


def test_no_flows():
    assert max_min_rates({"a": 1.0}, {}) == {}


def test_completion_times_reshare_when_a_flow_ends():
    flows = {"small": Flow(path=("a",), nbytes=10.0), "big": Flow(path=("a",), nbytes=30.0)}
    done = completion_times_s({"a": 10.0}, flows)
    # both at 5/s until small ends at t=2; big then has 20 left at 10/s
    assert done == pytest.approx({"small": 2.0, "big": 4.0})


def test_completion_times_with_late_start_and_empty_flow():
    flows = {
        "early": Flow(path=("a",), nbytes=20.0),
        "late": Flow(path=("a",), nbytes=10.0, start_s=1.0),
        "empty": Flow(path=("a",), nbytes=0.0, start_s=0.5),
    }
    done = completion_times_s({"a": 10.0}, flows)
    # early alone for 1 s (10 left), then both at 5/s: both finish at t=3
    assert done == pytest.approx({"early": 3.0, "late": 3.0, "empty": 0.5})


@pytest.mark.parametrize(
    ("caps", "flows", "message"),
    [
        ({"a": 0.0}, {"x": ["a"]}, "capacities: link 'a'"),
        ({"a": 1.0}, {"x": []}, "flows: flow 'x' has an empty path"),
        ({"a": 1.0}, {"x": ["b"]}, "flows: flow 'x' uses unknown link 'b'"),
        ({"a": 1.0}, {"x": ["a", "a"]}, "flows: flow 'x' crosses a link twice"),
    ],
)
def test_bad_input_names_the_field(caps, flows, message):
    with pytest.raises(ValueError, match=message):
        max_min_rates(caps, flows)


def test_negative_flow_size_rejected():
    with pytest.raises(ValueError, match="flows: flow 'x'"):
        completion_times_s({"a": 1.0}, {"x": Flow(path=("a",), nbytes=-1.0)})
