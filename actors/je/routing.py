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
    return tree.match(hashes, [te for role in PREFIX_ROLES for te in group.get(role, ())])


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
    decode_load = min((opened.get(te, 0) for te in group.get("decode", ()) if te not in j.excluded), default=0)
    out: list[Candidate] = []
    aside: list[Candidate] = []
    gone: list[Excluded] = []
    for role in roles:
        sub: Subgroup = "colocated" if role == "colocated" else "pd"
        prefill = role == "prefill"
        for te in group.get(role, ()):
            if te in j.excluded:
                gone.append(Excluded(te=te, subgroup=sub, reason="failed this job or refused it for good"))
                continue
            c = Candidate(te=te, subgroup=sub, load=opened.get(te, 0),
                          prefix_blocks=match.get(te, 0) if match and role != "decode" else 0,
                          decode_load=decode_load if prefill else 0)  # fmt: skip
            if prefill and now >= 0 and s.set_aside.get(te, -1.0) > now:
                aside.append(c)
            else:
                out.append(c)
    if not out and aside and fallback:
        return tuple(aside), tuple(gone)  # every other TE is gone: probe the set-aside ones
    gone += [Excluded(te=c.te, subgroup=c.subgroup, reason=f"set aside until t={s.set_aside[c.te]:.3f}: "
                      f"{s.set_aside_why.get(c.te, '')}") for c in aside]  # fmt: skip
    return tuple(out), tuple(gone)
