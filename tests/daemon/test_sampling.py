"""The emulated model's sampling (actors/flowserve/sampling.py): greedy is deterministic whatever
the seed, a seed reproduces a draw, a higher temperature draws from a wider distribution and
top_k/top_p/min_p narrow it; output lengths follow the lognormal fitted to the Azure trace."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import msgspec
import pytest

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.sampling import output_length_of, sampled_tokens
from deepserve.adapters.tokenizer import output_text
from deepserve.adapters.traces.fit_lengths import fit_lognormal, main
from deepserve.daemon.config import load_config

VOCAB = 32_000
AZURE_CONV = Path("/work/shared/traces/azure_llm_2023_conv.csv")


def _s(**kw: object) -> Sampling:
    return Sampling(**{"max_tokens": 64, "prompt_key": 77, **kw})  # type: ignore[arg-type]


def _words_at(position: int, seeds: range, **kw: object) -> set[str]:
    """The distinct words the model writes at one position over many seeds."""
    return {output_text(sampled_tokens(_s(seed=s, **kw), position, 1, VOCAB)) for s in seeds}


def test_greedy_is_the_same_whatever_the_seed_and_top_k_1_is_greedy() -> None:
    greedy = {sampled_tokens(_s(seed=s, temperature=0.0), 0, 40, VOCAB) for s in range(20)}
    assert len(greedy) == 1
    assert sampled_tokens(_s(seed=5, top_k=1, temperature=1.5), 0, 40, VOCAB) == greedy.pop()
    # the prompt decides a greedy output: another prompt, another text
    assert sampled_tokens(_s(temperature=0.0), 0, 40, VOCAB) != sampled_tokens(
        _s(temperature=0.0, prompt_key=78), 0, 40, VOCAB)


def test_a_seed_reproduces_a_draw_and_temperature_changes_it() -> None:
    a = sampled_tokens(_s(seed=9, temperature=1.0), 0, 40, VOCAB)
    assert a == sampled_tokens(_s(seed=9, temperature=1.0), 0, 40, VOCAB)
    assert a != sampled_tokens(_s(seed=10, temperature=1.0), 0, 40, VOCAB)
    assert a != sampled_tokens(_s(seed=9, temperature=2.0), 0, 40, VOCAB)
    # a run of tokens is the same drawn in one piece or in two (streamed one pass at a time)
    assert a == sampled_tokens(_s(seed=9), 0, 17, VOCAB) + sampled_tokens(_s(seed=9), 17, 23, VOCAB)


def test_higher_temperature_draws_from_a_wider_word_distribution() -> None:
    seeds = range(300)
    widths = [len(_words_at(3, seeds, temperature=t)) for t in (0.0, 0.3, 1.0, 2.0)]
    assert widths[0] == 1 and widths[0] < widths[1] < widths[2] < widths[3], widths
    # top_k / top_p / min_p narrow the draw
    assert len(_words_at(3, seeds, temperature=2.0, top_k=3)) <= 3
    assert len(_words_at(3, seeds, temperature=1.0, top_p=0.3)) == 1  # the head alone holds 0.5
    assert len(_words_at(3, seeds, temperature=2.0, min_p=0.2)) < widths[3]
    # at temperature 1 the top token has about half the mass (Zipf exponent 2)
    top = sampled_tokens(_s(temperature=0.0), 3, 1, VOCAB)[0]
    share = sum(sampled_tokens(_s(seed=s), 3, 1, VOCAB)[0] == top for s in range(2000)) / 2000
    assert 0.4 < share < 0.6, share


def test_output_lengths_follow_the_configured_lognormal() -> None:
    sched = load_config().cluster.scheduler
    assert sched.eos_model == "lognormal"
    law = (sched.eos_lognormal_mu, sched.eos_lognormal_sigma)
    lengths = [output_length_of(_s(seed=s, max_tokens=100_000), 0.0, law)[0] for s in range(4000)]
    assert abs(statistics.median(lengths) - math.exp(law[0])) / math.exp(law[0]) < 0.08
    assert sum(n <= 2 for n in lengths) / len(lengths) < 0.001  # not 1 % a token: few stop at once
    # the same seed, the same length; a greedy request's length depends on its prompt only
    assert output_length_of(_s(seed=3), 0.0, law) == output_length_of(_s(seed=3), 0.0, law)
    g = {output_length_of(_s(seed=s, temperature=0.0, max_tokens=10_000), 0.0, law) for s in range(30)}
    assert len(g) == 1


def test_min_tokens_defers_eos_and_ignore_eos_runs_to_max_tokens() -> None:
    law = (5.019, 0.859)
    early = next(s for s in range(10_000) if output_length_of(_s(seed=s, max_tokens=500), 0.0, law)[0] < 20)
    assert output_length_of(_s(seed=early, max_tokens=500, min_tokens=20), 0.0, law) == (20, "stop")
    assert output_length_of(_s(seed=early, max_tokens=500, ignore_eos=True), 0.0, law) == (500, "length")
    # the old per-token rate model, unchanged for simulations
    assert output_length_of(_s(seed=1, max_tokens=10_000), 0.01, None)[1] == "stop"


def test_the_fit_reads_a_trace_and_a_bad_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = [10, 20, 40, 80, 160]
    mu, sigma = fit_lognormal(lengths)
    assert abs(mu - statistics.fmean(math.log(x) for x in lengths)) < 1e-12 and sigma > 0
    trace = tmp_path / "t.csv"
    rows = "".join(f"2023-11-16 18:15:{i:02d}.0000000,100,{n}\n" for i, n in enumerate(lengths))
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    assert main([str(trace)]) == 0
    assert f"eos_lognormal_mu = {mu:.4f}" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.csv" in err


@pytest.mark.skipif(not AZURE_CONV.exists(), reason="the Azure trace is not on this machine")
def test_the_configured_law_is_the_fit_of_the_azure_conversation_trace() -> None:
    from deepserve.adapters.traces.reader import open_trace

    mu, sigma = fit_lognormal([r.output_tokens for r in open_trace(AZURE_CONV)])
    sched = load_config().cluster.scheduler
    assert (round(mu, 3), round(sigma, 3)) == (sched.eos_lognormal_mu, sched.eos_lognormal_sigma)


def test_sampling_fields_are_carried_additively() -> None:
    """Old logs decode: a Sampling without the new fields takes the neutral values."""
    old = msgspec.json.decode(b'{"max_tokens": 5, "seed": 3}', type=Sampling)
    assert (old.temperature, old.top_p, old.top_k, old.min_p, old.min_tokens) == (1.0, 1.0, -1, 0.0, 0)
