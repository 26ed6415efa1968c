"""What the JE hands a policy: the candidate TEs of a job's next task, from one walk of its
prompt down the model's global prompt tree, and the TEs left out with the reason (`replay why`
lists both). Pure functions of the JE's state."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from deepserve.actors.scheduling import Policy
from deepserve.actors.scheduling.decision import (
    Candidate,
    Decision,
    Excluded,
    RouteRequest,
    Subgroup,
)
from deepserve.actors.scheduling.pool import Pool

from .kvlinks import path_down
from .messages import JeState, Job

PREFIX_ROLES = ("colocated", "prefill")  # decode TEs never enter the prompt tree


def group_match(s: JeState, model: str, hashes: tuple[int, ...]) -> dict[str, int]:
    """Leading prompt blocks each colocated and prefill TE of `model` holds."""
    return group_walk(s, model, hashes)[0]


def group_walk(s: JeState, model: str, hashes: tuple[int, ...]) -> tuple[dict[str, int], int]:
    """(`group_match`, its longest value): the one walk a decision makes — the predictor reads
    the longest match, the candidates their prefixes (`PromptTree.walk`)."""
    tree = s.trees.get(model)
    if tree is None:
        return {}, 0
    group = s.groups.get(model, {})
    return tree.walk(hashes, [*group.get("colocated", ()), *group.get("prefill", ())])


def candidates(s: JeState, j: Job, roles: tuple[str, ...], now: float = -1.0,
               match: dict[str, int] | None = None, fallback: bool = True
               ) -> tuple[tuple[Candidate, ...], tuple[Excluded, ...]]:  # fmt: skip
    """(the TEs of `roles` that may take the job's next task, the others of those roles with
    why). With `now`, a prefill TE set aside (`PrefillSetAside`) is left out — unless no other
    TE is left and `fallback`, then the set-aside ones are the candidates."""
    if roles == ("decode",):
        tes, load = s.groups.get(j.model, {}).get("decode", ()), s.open.get
        failed = tuple([Excluded(tes=(te,), subgroup="pd", reason="failed this job or refused it for good")
                        for te in tes if te in j.excluded])  # fmt: skip
        if s.kv_down or s.kv_busy:  # link probing's verdicts (kvlinks.py)
            tes, cut = kv_decodes(s, j.prefill_te, [te for te in tes if te not in j.excluded])
            failed += cut
        return tuple([Candidate(te=te, subgroup="pd", load=load(te, 0)) for te in tes if te not in j.excluded]), failed
    if "decode" in roles:
        raise ValueError(f"roles {roles}: decode TEs are candidates on their own")
    p, left = pool(s, j, roles, now, match, fallback)
    return p.all(), left


def pool(s: JeState, j: Job, roles: tuple[str, ...] = ("colocated", "prefill"), now: float = -1.0,
         match: dict[str, int] | None = None, fallback: bool = True) -> tuple[Pool, tuple[Excluded, ...]]:
    """`candidates` of the colocated and prefill `roles` as a `Pool`: TE names, read into
    `Candidate` records only where the policy ranks them (scheduling/pool.py)."""
    group = s.groups.get(j.model, {})
    if match is None:
        match = group_match(s, j.model, j.prompt.block_hashes)
    excluded = j.excluded
    if not excluded and (now < 0 or not s.set_aside) and roles == PREFIX_ROLES and not s.kv_down:  # the usual arrival
        decode_load = least_open(s.open, group.get("decode", ()))
        return Pool(group.get("colocated", ()), group.get("prefill", ()), s.open, match, decode_load), ()
    colo: Sequence[str] = ()
    pre: Sequence[str] = ()
    gone: list[Excluded] = []
    aside: list[str] = []
    for role in roles:  # the group's own lists unless a TE is left out: the pool only reads them
        sub: Subgroup = "colocated" if role == "colocated" else "pd"
        tes: Sequence[str] = group.get(role, ())
        if excluded:
            gone += [Excluded(tes=(te,), subgroup=sub, reason="failed this job or refused it for good")
                     for te in tes if te in excluded]  # fmt: skip
            tes = [te for te in tes if te not in excluded]
        if role == "colocated":
            colo = tes
            continue
        if now >= 0 and s.set_aside:
            aside += [te for te in tes if s.set_aside.get(te, -1.0) > now]
            tes = [te for te in tes if s.set_aside.get(te, -1.0) <= now]
        pre = tes
    if s.kv_down and pre:  # a prefill whose KV reaches no decode (kvlinks.py) while another TE can serve
        cut = [te for te in pre if not reachable(s, te, group.get("decode", ()))]
        if cut and (colo or len(cut) < len(pre)):
            pre = [te for te in pre if te not in cut]
            gone += [Excluded(tes=(te,), subgroup="pd", reason=f"its KV reaches no decode TE: "
                              f"{path_down(s, te, group['decode'][0]) if group.get('decode') else ''}")
                     for te in cut]  # fmt: skip
    decode_load = 0
    if "prefill" in roles:
        decodes = group.get("decode", ())
        if excluded:
            decodes = [te for te in decodes if te not in excluded]
        decode_load = least_open(s.open, decodes)
    if not colo and not pre and aside and fallback:
        return Pool((), aside, s.open, match, decode_load), tuple(gone)  # every other TE is gone: probe these
    gone += [Excluded(tes=(te,), subgroup="pd", reason=f"set aside until t={s.set_aside[te]:.3f}: "
                      f"{s.set_aside_why.get(te, '')}") for te in aside]  # fmt: skip
    return Pool(colo, pre, s.open, match, decode_load), tuple(gone)


def reachable(s: JeState, prefill: str, decodes: Sequence[str]) -> bool:
    """Some decode TE of `decodes` takes `prefill`'s KV over a path not diagnosed blocked."""
    return any(not path_down(s, prefill, d) for d in decodes)


def kv_decodes(s: JeState, prefill: str, tes: Sequence[str]) -> tuple[list[str], tuple[Excluded, ...]]:
    """(the decode TEs of `tes` to offer `prefill`'s KV, the others with why): link probing's
    verdicts (kvlinks.py) leave out a decode the KV cannot reach, and one backed off as busy
    (a saturated KV path) while another can take the task."""
    cut = [Excluded(tes=(d,), subgroup="pd", reason=f"KV path blocked: {path_down(s, prefill, d)}")
           for d in tes if prefill and path_down(s, prefill, d)]  # fmt: skip
    left = [d for d in tes if not (prefill and path_down(s, prefill, d))]
    busy = [d for d in left if d in s.kv_busy]
    if busy and len(busy) < len(left):
        cut += [Excluded(tes=(d,), subgroup="pd", reason=f"backed off until t={s.kv_busy[d]:.3f}: its KV path "
                         "is saturated (busy, not down)") for d in busy]  # fmt: skip
        left = [d for d in left if d not in s.kv_busy]
    return left, tuple(cut)


def route_request(rid: str, j: Job) -> RouteRequest:
    """What a policy reads of the job."""
    return RouteRequest(request_id=rid, prompt_tokens=j.prompt.num_tokens,
                        prompt_blocks=len(j.prompt.block_hashes), predicted_bucket=j.predicted_bucket)  # fmt: skip


def least_open(load: dict[str, int], tes: Sequence[str]) -> int:
    """The fewest open tasks on any of `tes` (0: none). A typed loop: compiled, it reads the
    dict in C without the iterator objects `min(map(...))` builds."""
    least, found = 0, False
    for te in tes:
        n = load.get(te, 0)
        if not found or n < least:
            least, found = n, True
    return least


def decide(s: JeState, policy: Policy, rid: str, j: Job, now: float,
           match: dict[str, int] | None = None) -> Decision | None:  # fmt: skip
    """The policy's choice for the job's chat-or-prefill task (None: no TE), with every TE it
    did not rank and why. `deepserve bench routing` times it (here: in the compiled group)."""
    # a prefill is of use only with a decode TE to take its KV: when every decode TE has
    # failed this job, its retry goes to a colocated TE
    decodes = not j.excluded or candidates(s, j, ("decode",))[0]
    roles = PREFIX_ROLES if decodes else ("colocated",)
    p, gone = pool(s, j, roles, now, match)
    if not p:
        return None
    d = policy.select_pool(route_request(rid, j), p, s.turns)
    return msgspec.structs.replace(d, excluded=d.excluded + gone) if gone else d
