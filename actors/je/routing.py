"""What the JE hands a policy: the candidate TEs of a job's next task, from one walk of its
prompt down the model's global prompt tree, and the TEs left out with the reason (`replay why`
lists both). Pure functions of the JE's state."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from deepserve.actors.scheduling.decision import Candidate, Excluded, Subgroup
from deepserve.actors.scheduling.pool import Pool

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
    if not excluded and (now < 0 or not s.set_aside) and roles == PREFIX_ROLES:  # the usual arrival
        decode_load = min(map(s.open.get, group.get("decode", ()), repeat(0)), default=0)
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
    decode_load = 0
    if "prefill" in roles:
        decodes = group.get("decode", ())
        if excluded:
            decodes = [te for te in decodes if te not in excluded]
        decode_load = min(map(s.open.get, decodes, repeat(0)), default=0)
    if not colo and not pre and aside and fallback:
        return Pool((), aside, s.open, match, decode_load), tuple(gone)  # every other TE is gone: probe these
    gone += [Excluded(tes=(te,), subgroup="pd", reason=f"set aside until t={s.set_aside[te]:.3f}: "
                      f"{s.set_aside_why.get(te, '')}") for te in aside]  # fmt: skip
    return Pool(colo, pre, s.open, match, decode_load), tuple(gone)
