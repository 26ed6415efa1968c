"""A migrated stream resuming in P/D (`SubmitTask.resume_from` on a prefill and its decode, xLLM
§3.5 by recomputation): the prefill computes the prompt and the n tokens the client has, emits
token n and hands over a KV of prompt + n tokens (fingerprints alike on both sides); the decode
continues from n + 1 — the very tokens a fresh P/D run of the request streams there."""

from __future__ import annotations

from fsharness import assert_replays, events_of
from test_fs_pd import P, _msgs, run_pd

from deepserve.actors.flowserve.messages import TaskFinished, TaskTokens


def stream(d, i: int) -> dict[int, int]:
    """Token index -> id of request i, over its prefill's and decode's chunks."""
    out: dict[int, int] = {}
    for m in _msgs(d, TaskTokens):
        if m.task_id.startswith(f"t{i}:"):
            for k, t in enumerate(m.token_ids):
                assert out.setdefault(m.first_index + k, t) == t
    return out


def test_a_resumed_pd_request_prefills_its_prefix_and_decodes_on_from_its_token() -> None:
    fresh, moved = run_pd(n=2, out=40, token_ids=True), run_pd(n=2, out=40, resume=15, token_ids=True)
    fins = {m.task_id: m for m in _msgs(moved, TaskFinished)}
    for i in range(2):
        p, dd = fins[f"t{i}:p"], fins[f"t{i}:d"]
        assert (p.status, p.reason, dd.status, dd.reason) == ("completed", "prefilled", "completed", "target")
        assert p.kv is not None and p.kv.num_tokens == 1000 + 300 * i + 15  # prompt + the client's 15
        assert dd.output_tokens == 40  # the whole output counted, not 40 more
        chunks = sorted((m.first_index, m.task_id) for m in _msgs(moved, TaskTokens) if m.task_id.startswith(f"t{i}:"))
        assert chunks[0] == (15, f"t{i}:p") and chunks[1] == (16, f"t{i}:d")  # no duplicate, no skip
        want, got = stream(fresh, i), stream(moved, i)
        assert sorted(got) == list(range(15, 40)) and got == {k: want[k] for k in range(15, 40)}
        assert p.kv.first_token_id == want[15]  # the prefill's token is the one a fresh run has there
    first = [e for e in events_of(moved, f"{P}/dp/0", "BatchPlanned") if e.entries][0]
    assert first.entries[0].n == 1015  # one prefill of the prompt and the 15 tokens
    assert not moved.actor(f"{P}/dp/0").state.held and not moved.actor("te/d/dp/0").state.rtc.seqs
    assert_replays(moved)

