"""The emulated sampling draws the same tokens and output lengths in both builds: sampling.py and
tokens.py are in the compiled build's master group (compiled.py), so the module imported here is
the C extension when the build is in place; the same sources loaded as plain Python modules are
the reference. (Without the build both sides are Python, and the test holds trivially.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from hypothesis import given, settings
from hypothesis import strategies as st

import deepserve
from deepserve.actors.flowserve import sampling, tokens
from deepserve.actors.flowserve.messages import Sampling

_ROOT = Path(deepserve.__file__).parent / "actors" / "flowserve"


def _pure(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"pure_{name}", _ROOT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TOKENS = _pure("tokens")
_SAMPLING = _pure("sampling")
_SAMPLING.combine, _SAMPLING.mix64 = _TOKENS.combine, _TOKENS.mix64  # pure all the way down

u64 = st.integers(0, 2**64 - 1)
samplings = st.builds(
    Sampling, max_tokens=st.integers(1, 4096), seed=u64, prompt_key=u64, ignore_eos=st.booleans(),
    temperature=st.one_of(st.sampled_from([0.0, 1e-6, 1.0, 2.0]), st.floats(0.01, 3.0)),
    top_p=st.one_of(st.just(1.0), st.floats(0.01, 1.0)), top_k=st.sampled_from([-1, 0, 1, 5, 50]),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.5)), min_tokens=st.integers(0, 8),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(s=samplings, start=st.integers(0, 2000), count=st.integers(1, 24),
       vocab=st.sampled_from([50, 32_000, 128_256]), key=u64,
       lognormal=st.tuples(st.floats(0.0, 8.0), st.floats(0.1, 3.0)))  # fmt: skip
def test_the_build_samples_as_the_source(s: Sampling, start: int, count: int, vocab: int, key: int,
                                         lognormal: tuple[float, float]) -> None:  # fmt: skip
    assert sampling.sampled_tokens(s, start, count, vocab) == _SAMPLING.sampled_tokens(s, start, count, vocab)
    for eos_rate, eos_lognormal in ((0.01, None), (0.0, lognormal), (0.0, (5.019, 0.859))):
        got = sampling.output_length_of(s, eos_rate, eos_lognormal)
        assert got == _SAMPLING.output_length_of(s, eos_rate, eos_lognormal)
    assert tokens.combine(key, start) == _TOKENS.combine(key, start)
    assert tokens.eos_index(key, 0.01) == _TOKENS.eos_index(key, 0.01)
    ids = list(range(start % 97))
    assert tokens.chain_hashes_from_tokens(ids, 16) == _TOKENS.chain_hashes_from_tokens(ids, 16)


def test_a_tiny_min_p_at_a_high_temperature_cuts_no_rank_instead_of_overflowing() -> None:
    """Found by the property above (2026-11-29): min_p=1e-300 at temperature 3 overflowed
    `min_p ** (-1/a)`, an OverflowError in the master's pass for a request the API accepts."""
    s = Sampling(max_tokens=4, temperature=3.0, min_p=1e-300, seed=1)
    assert _SAMPLING.ranks_allowed(s, 32_000) == sampling.ranks_allowed(s, 32_000) == 31_999
    assert sampling.sampled_tokens(s, 0, 3, 32_000) == _SAMPLING.sampled_tokens(s, 0, 3, 32_000)
