"""Trace readers: both formats detected by content, streamed, and every bad row refused with an
error naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.traces import TraceError, open_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    return path


def _mooncake_line(ts: float = 0, inp: int = 600, out: int = 5, ids: list[int] | None = None) -> str:
    ids = ids if ids is not None else list(range(-(-inp // 512)))
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


def _error(path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        list(open_trace(path))
    return info.value


def test_mooncake_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    lines = [_mooncake_line(0, 1024, 3, [7, 8]), _mooncake_line(1500, 600, 9, [7, 9])]
    path = _write(tmp_path, "trace.csv", "\n".join(lines) + "\n")
    trace = open_trace(path)
    assert trace.format == "mooncake"
    reqs = list(trace)
    assert [(r.index, r.line, r.arrival_s) for r in reqs] == [(0, 1, 0.0), (1, 2, 1.5)]
    assert reqs[0].hash_ids == (7, 8) and reqs[1].prompt_tokens == 600
    assert reqs[1].output_tokens == 9


def test_azure_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    rows = "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    path = _write(tmp_path, "trace.jsonl", AZURE_HEADER + rows)
    trace = open_trace(path)
    assert trace.format == "azure"
    reqs = list(trace)
    assert reqs[0].arrival_s == 0.0 and reqs[0].hash_ids is None
    assert reqs[1].arrival_s == pytest.approx(4.314579)
    assert (reqs[1].prompt_tokens, reqs[1].output_tokens, reqs[1].line) == (396, 109, 3)


def test_azure_columns_in_any_order_with_extra_columns_and_bom(tmp_path: Path) -> None:
    text = "\ufeffGeneratedTokens,Extra,TIMESTAMP,ContextTokens\n7,x,2023-11-16 18:15:46.68,100\n"
    reqs = list(open_trace(_write(tmp_path, "t", text)))
    assert (reqs[0].prompt_tokens, reqs[0].output_tokens) == (100, 7)


def test_the_shared_traces_read_whole() -> None:
    root = Path(__file__).resolve().parents[3] / "shared" / "traces"
    if not root.exists():
        pytest.skip("../shared/traces not present")
    trace = open_trace(root / "mooncake_conversation.jsonl")
    n = sum(1 for _ in trace)
    assert n == 12_031
    assert sum(1 for _ in open_trace(root / "azure_llm_2023_code.csv")) == 8_819


@pytest.mark.parametrize(
    ("line", "field", "problem"),
    [
        ('{"timestamp": 0, "input_length": "ten", "output_length": 1, "hash_ids": [0]}',
         "input_length", "Expected `int`, got `str`"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": [0]}', "input_length", "missing"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}',
         "timestamp", ">= 0"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [0]}',
         "output_length", "outside 1.."),
        ('{"timestamp": 0, "input_length": 0, "output_length": 2, "hash_ids": []}',
         "input_length", "outside 1.."),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0, -3]}',
         "hash_ids[1]", ">= 0"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}',
         "hash_ids", "1 ids for input_length 1000"),
        ('{"timestamp": 0, "input_length": 10,', "row", "not valid JSON"),
        ('[1, 2]', "row", "Expected `object`"),
    ],
)  # fmt: skip
def test_mooncake_bad_row_names_file_line_field(
    tmp_path: Path, line: str, field: str, problem: str
) -> None:
    path = _write(tmp_path, "m.jsonl", _mooncake_line() + "\n\n" + line + "\n")
    err = _error(path)
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert problem in err.problem
    assert str(err).startswith(f"{path}:3: {field}: ")


def test_an_arrival_beyond_what_virtual_time_resolves_is_refused(tmp_path: Path) -> None:
    """A user tour's row at 1e22 ms failed its request with a bogus NPU timeout."""
    path = _write(tmp_path, "m", _mooncake_line(0) + "\n" + _mooncake_line(1e22) + "\n")
    err = _error(path)
    assert (err.line, err.field) == (2, "timestamp") and "beyond the 1e+08 s" in err.problem
    ok = _write(tmp_path, "ok", _mooncake_line(0) + "\n" + _mooncake_line(1e11) + "\n")  # 1e8 s
    assert len(list(open_trace(ok))) == 2


def test_mooncake_out_of_order_arrival_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "m", _mooncake_line(5000) + "\n" + _mooncake_line(4000) + "\n")
    err = _error(path)
    assert (err.line, err.field) == (2, "timestamp")
    assert "sorted by arrival" in err.problem


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ("2023-11-16 18:15:47,abc,3", "ContextTokens", "'abc' is not an integer"),
        ("2023-11-16 18:15:47,10,", "GeneratedTokens", "'' is not an integer"),
        ("yesterday,10,3", "TIMESTAMP", "is not a time"),
        ("2023-11-16 18:15:47,10", "GeneratedTokens", "row has 2 fields"),
        ("2023-11-16 18:15:47,0,3", "ContextTokens", "outside 1.."),
        ("2023-11-16 18:15:45,10,3", "TIMESTAMP", "sorted by arrival"),
        # a user tour: a row with a field too many was read silently
        ("2023-11-16 18:15:47,10,3,7", "row", "row has 4 fields, the header names 3"),
    ],
)
def test_azure_bad_row_names_file_line_field(
    tmp_path: Path, row: str, field: str, problem: str
) -> None:
    text = AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\n" + row + "\n"
    path = _write(tmp_path, "a.csv", text)
    err = _error(path)
    assert (err.line, err.field) == (3, field)
    assert problem in err.problem


def test_an_azure_header_without_rows_is_refused_like_an_empty_file(tmp_path: Path) -> None:
    err = _error(_write(tmp_path, "a.csv", AZURE_HEADER))
    assert (err.line, err.field) == (1, "format") and "no rows" in err.problem


def test_azure_header_missing_a_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:47,10\n")
    with pytest.raises(TraceError) as info:
        open_trace(path)  # refused on open, before any run starts
    assert (info.value.line, info.value.field) == (1, "GeneratedTokens")


def test_azure_non_utf8_row(tmp_path: Path) -> None:
    data = AZURE_HEADER.encode() + b"2023-11-16 18:15:47,1\xff0,3\n"
    err = _error(_write(tmp_path, "a.csv", data))
    assert (err.line, err.field) == (2, "row") and "UTF-8" in err.problem


@pytest.mark.parametrize(
    ("content", "problem"),
    [("", "empty"), ("\n\n", "empty"), ("hello,world\n1,2\n", "neither Mooncake JSONL")],
)
def test_unknown_or_empty_file_refused_on_open(tmp_path: Path, content: str, problem: str) -> None:
    with pytest.raises(TraceError) as info:
        open_trace(_write(tmp_path, "x", content))
    assert info.value.field == "format" and problem in info.value.problem


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as info:
        open_trace(tmp_path / "nope.jsonl")
    assert info.value.field == "path" and "No such file" in str(info.value)


rows = st.lists(
    st.tuples(
        st.integers(0, 10_000), st.integers(1, 5000), st.integers(1, 2000),
        st.integers(0, 50),
    ),  # fmt: skip
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(rows=rows)
def test_mooncake_round_trip(tmp_path_factory: pytest.TempPathFactory, rows: list) -> None:
    """Whatever valid rows are written are read back: same order, lengths and ids."""
    ts, lines, expect = 0, [], []
    for gap, inp, out, base in rows:
        ts += gap
        ids = [base + k for k in range(-(-inp // 512))]
        lines.append(_mooncake_line(ts, inp, out, ids))
        expect.append((ts / 1000, inp, out, tuple(ids)))
    path = tmp_path_factory.mktemp("m") / "t"
    path.write_text("\n".join(lines) + "\n")
    got = [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in open_trace(path)]
    assert got == expect


@settings(max_examples=60, deadline=None)
@given(
    good=st.integers(1, 8),
    field=st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]),
    junk=st.sampled_from(['"x"', "null", "[]", "{}", "-5", "true"]),
)
def test_mooncake_any_corrupted_field_is_named(
    tmp_path_factory: pytest.TempPathFactory, good: int, field: str, junk: str
) -> None:
    """Corrupt one field of one row after `good` valid rows: the error names that line and field."""
    lines = [_mooncake_line(i, 600, 3, [0, i + 1]) for i in range(good)]
    row = json.loads(_mooncake_line(good, 600, 3, [0, 99]))
    row[field] = json.loads(junk)
    lines.append(json.dumps(row))
    path = tmp_path_factory.mktemp("m") / "t"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as info:
        list(open_trace(path))
    assert info.value.line == good + 1
    assert info.value.field.partition("[")[0] == field


# ---- trace requests as prompts ---------------------------------------------------------------

from deepserve.adapters.traces import TraceRequest  # noqa: E402
from deepserve.adapters.traces.prompts import prompt_of  # noqa: E402


def _req(index: int, tokens: int, ids: tuple[int, ...] | None) -> TraceRequest:
    return TraceRequest(index, index + 1, 0.0, tokens, 1, ids)


@pytest.mark.parametrize("block", [64, 128, 256, 512, 1024])
def test_mooncake_shared_ids_share_exactly_the_blocks_inside_them(block: int) -> None:
    a = prompt_of(_req(0, 2048, (1, 2, 3, 4)), block)
    b = prompt_of(_req(1, 2048, (1, 2, 9, 4)), block)  # shares the first 1024 tokens only
    assert a.num_tokens == 2048 and len(a.block_hashes) == 2048 // block
    shared = sum(1 for x, y in zip(a.block_hashes, b.block_hashes, strict=True) if x == y)
    assert shared == 1024 // block
    assert a.block_hashes[: 1024 // block] == b.block_hashes[: 1024 // block]


def test_partial_blocks_get_no_hash_and_prompts_are_deterministic() -> None:
    p = prompt_of(_req(0, 700, (5, 6)), 128)
    assert len(p.block_hashes) == 5  # 700 // 128
    assert p == prompt_of(_req(0, 700, (5, 6)), 128)


def test_azure_requests_share_nothing() -> None:
    a, b = prompt_of(_req(0, 1024, None), 128), prompt_of(_req(1, 1024, None), 128)
    assert len(a.block_hashes) == 8 and not set(a.block_hashes) & set(b.block_hashes)
    assert prompt_of(_req(0, 1024, None), 128, salt=1).block_hashes != a.block_hashes


@settings(max_examples=50, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 1000), min_size=0, max_size=6),
    tail_a=st.lists(st.integers(1001, 2000), min_size=1, max_size=4),
    tail_b=st.lists(st.integers(2001, 3000), min_size=1, max_size=4),
    block=st.sampled_from([128, 256, 512]),
)
def test_common_trace_prefix_is_the_common_block_prefix(prefix, tail_a, tail_b, block) -> None:
    """Two Mooncake requests agree on exactly the KV blocks lying in their common id prefix."""
    ids_a, ids_b = (*prefix, *tail_a), (*prefix, *tail_b)
    a = prompt_of(_req(0, 512 * len(ids_a), ids_a), block)
    b = prompt_of(_req(1, 512 * len(ids_b), ids_b), block)
    common = 0
    for x, y in zip(a.block_hashes, b.block_hashes, strict=False):
        if x != y:
            break
        common += 1
    assert common == len(prefix) * 512 // block


# ---- many prompts at once (chains.py): the same hashes as one by one ------------------------

from deepserve.adapters.traces.chains import trace_chain_hashes_many  # noqa: E402
from deepserve.adapters.traces.prompts import prompts_of  # noqa: E402


@pytest.mark.parametrize("block", [64, 128, 256, 512, 1024, 100])
def test_prompts_of_the_mooncake_fixture_equal_prompt_of_each(block: int) -> None:
    from deepserve.adapters.scenario.loader import trace_path

    reqs = list(open_trace(trace_path("builtin:mooncake_conv_1k")))
    assert prompts_of(reqs, block) == [prompt_of(r, block) for r in reqs]


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.lists(st.integers(-(1 << 63), (1 << 64) + 5), max_size=40), st.integers(0, 40 * 512)),
        max_size=40,
    ),
    block=st.sampled_from([128, 256, 512, 300]),
)
def test_many_chains_equal_the_scalar_chains_or_leave_them_to_it(prompts, block) -> None:
    """Odd ids (negative, past 64 bits), ids that cannot cover the prompt, empty prompts: every
    answer equals the scalar function's, or is None where the scalar one must answer."""
    from deepserve.actors.flowserve.tokens import chain_hashes_from_trace_blocks

    many = trace_chain_hashes_many([(tuple(ids), n) for ids, n in prompts], block, 512)
    for (ids, n), got in zip(prompts, many, strict=True):
        fits = -(-n // 512) <= len(ids) and all(-(1 << 63) <= x < (1 << 63) for x in ids[: -(-n // 512)])
        if 512 % block or not fits:
            assert got is None
        else:
            assert got == chain_hashes_from_trace_blocks(ids, n, block)


def test_a_bad_row_raises_after_the_rows_before_it(tmp_path) -> None:
    """`arrivals` reads rows in chunks: a malformed row still comes after every good row
    before it has been yielded."""
    from deepserve.adapters.scenario.loader import load_scenario
    from deepserve.cluster.run import arrivals

    good = '{"timestamp": %d, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    path = tmp_path / "t.jsonl"
    path.write_text("".join(good % (i * 10) for i in range(5)) + '{"timestamp": 60, "input_length": "x"}\n')
    feed = arrivals(load_scenario("mooncake-16te", ()), str(path), None)
    got = []
    with pytest.raises(TraceError):
        for _, msg in feed:
            got.append(msg)
    assert [m.request_id for m in got] == [f"r{i}" for i in range(5)]
