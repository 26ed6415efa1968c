"""What the JE hands a policy: the candidate TEs of a job's next task, from one walk of its
prompt down the model's global prompt tree, and the TEs left out with the reason (`replay why`
lists both). Pure functions of the JE's state."""

from __future__ import annotations

from deepserve.actors.scheduling.decision import Candidate, Excluded, Subgroup

from .messages import JeState, Job

PREFIX_ROLES = ("colocated", "prefill")  # decode TEs never enter the prompt tree


def group_match(s: JeState, model: str, hashes: tuple[int, ...]) -> dict[str, int]:
    """Leading prompt blocks each colocated and prefill TE of `model` holds: the one walk a
    decision makes (the predictor's longest match and the candidates' prefixes both read it)."""
    tree = s.trees.get(model)
    if tree is None:
        return {}
    group = s.groups.get(model, {})
    return tree.match(hashes, [*group.get("colocated", ()), *group.get("prefill", ())])


def candidates(s: JeState, j: Job, roles: tuple[str, ...], now: float = -1.0,
               match: dict[str, int] | None = None, fallback: bool = True
               ) -> tuple[tuple[Candidate, ...], tuple[Excluded, ...]]:  # fmt: skip
    """(the TEs of `roles` that may take the job's next task, the others of those roles with
    why). With `now`, a prefill TE set aside (`PrefillSetAside`) is left out — unless no other
    TE is left and `fallback`, then the set-aside ones are the candidates."""
    group = s.groups.get(j.model, {})
    if match is None and any(r != "decode" for r in roles):
        match = group_match(s, j.model, j.prompt.block_hashes)
    opened = s.open
    load = opened.get
    held = (match or {}).get
    excluded = j.excluded
    decode_load = min((load(te, 0) for te in group.get("decode", ()) if te not in excluded), default=0)
    out: list[Candidate] = []
    aside: list[Candidate] = []
    gone: list[Excluded] = []
    for role in roles:
        sub: Subgroup = "colocated" if role == "colocated" else "pd"
        tes = group.get(role, ())
        if excluded:
            gone += [Excluded(tes=(te,), subgroup=sub, reason="failed this job or refused it for good")
                     for te in tes if te in excluded]  # fmt: skip
            tes = [te for te in tes if te not in excluded]
        if role == "colocated":
            out += [Candidate(te=te, subgroup=sub, load=load(te, 0), prefix_blocks=held(te, 0)) for te in tes]
        elif role == "decode":
            out += [Candidate(te=te, subgroup=sub, load=load(te, 0)) for te in tes]
        else:
            cands = [Candidate(te=te, subgroup=sub, load=load(te, 0), prefix_blocks=held(te, 0),
                               decode_load=decode_load) for te in tes]  # fmt: skip
            if now >= 0 and s.set_aside:
                aside += [c for c in cands if s.set_aside.get(c.te, -1.0) > now]
                cands = [c for c in cands if s.set_aside.get(c.te, -1.0) <= now]
            out += cands
    if not out and aside and fallback:
        return tuple(aside), tuple(gone)  # every other TE is gone: probe the set-aside ones
    gone += [Excluded(tes=(c.te,), subgroup=c.subgroup, reason=f"set aside until t={s.set_aside[c.te]:.3f}: "
                      f"{s.set_aside_why.get(c.te, '')}") for c in aside]  # fmt: skip
    return tuple(out), tuple(gone)
