"""`deepserve replay why LOG REQUEST_ID`: why did request X go where it went?

Reads only the log: the gateway's `GatewayRouted`/`GatewayRefused` (admission, the JE drawn),
the JE's `RouteDecided` (each task's policy, parameters, every eligible TE ranked with its score
components, ties and the margin to the runner-up, every TE left out with the reason, heatmap
cell, predicted bucket), the policy's choice when the task was queued instead (`RouteQueued`)
and its waits (`PrefillWaiting`), task ends and refusals (busy or for good), a cancel the client asked
for (`JobCancelRequested`: a TTFT deadline, a disconnect, a stop sequence), the faults injected
while it ran and the last few before it (`deepserve fault`, a scenario's `[[faults]]`: "FAULT"
lines), what the control plane did meanwhile to a TE the request used (`TeDeclaredFailed` with its
diagnosis, a replacement's `TeReady`: "CONTROL" lines), and the terminal record;
runs driven by the workload stand-in (`deepserve sim`) show its `RequestDispatched` round-robin
hops, its `RequestPrefilled` (P/D) and `RequestFinished` instead. Streams the log once, decoding
only the event types it shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from deepserve.core import decode
from deepserve.persistence.api import LogReader

from .common import ReplayError, first_few, pick_run

HOP_TYPES = frozenset({
    "GatewayRouted", "GatewayRefused", "RouteDecided", "OfferRefused", "JeTaskEnded", "JePrefilled",
    "JobFinished", "RequestDispatched", "RequestPrefilled", "RequestFinished", "JobCancelRequested",
    "PrefillWaiting", "RouteQueued", "TaskMigrated", "MigrationAsked",
})  # fmt: skip
TERMINAL = ("JobFinished", "RequestFinished")
FAULT_SOURCES = frozenset({"ext/admin", "ext/fault"})  # `deepserve fault`/`scale`; a scenario's plan
MAX_FAULTS = 100_000
FAULTS_BEFORE = 3  # faults shown from before the request arrived
MAX_KNOWN = 8  # request ids named when the one asked for is absent
# the cluster manager's, about one TE (LadderChose: the recovery ladder's rung and what it did)
CONTROL_TYPES = frozenset({"TeDeclaredFailed", "TeReady", "LadderChose"})


def _load_types() -> None:
    """Register the event classes by importing their modules (decode works by type name)."""
    import deepserve.actors.cluster.state  # noqa: F401
    import deepserve.actors.gateway.messages  # noqa: F401
    import deepserve.actors.je.messages  # noqa: F401
    import deepserve.actors.je.migration  # noqa: F401
    import deepserve.actors.ports.faults  # noqa: F401
    import deepserve.actors.ports.pod  # noqa: F401
    import deepserve.actors.workload.messages  # noqa: F401


def request_hops(reader: LogReader, request_id: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every recorded hop of the request, in log order, as plain data."""
    _load_types()
    import msgspec

    run = pick_run(reader, run_id)
    hops: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    known: dict[str, None] = {}  # the first request ids seen, for the error below
    for step in reader.steps(run.run_id):
        if step.input.src in FAULT_SOURCES and len(faults) < MAX_FAULTS:
            faults.append(_fault_hop(step.input))
        for ev in step.events:
            if ev.type in CONTROL_TYPES and len(faults) < MAX_FAULTS:
                data = msgspec.to_builtins(decode(ev.type, ev.payload))
                data.pop("type", None)
                faults.append({"t": step.input.t, "actor": step.input.actor, "event": "Control", "kind": ev.type,
                               **data})  # fmt: skip
                continue
            if ev.type not in HOP_TYPES:
                continue
            data = msgspec.to_builtins(decode(ev.type, ev.payload))
            rid = data.get("request_id") or (data.get("done") or {}).get("request_id")
            if rid == request_id:
                data.pop("type", None)
                hops.append({"t": step.input.t, "actor": step.input.actor, "event": ev.type, **data})
            elif rid is not None and len(known) <= MAX_KNOWN:
                known[rid] = None
    if not hops:
        named = f"requests: {first_few(list(known), MAX_KNOWN)}" if known else "it records no request hops"
        raise ReplayError(f"no request {request_id!r} in run {run.run_id!r} ({named})")
    return _with_faults(hops, faults)


def _fault_hop(rec: Any) -> dict[str, Any]:
    """An injected fault or admin action (kill-te, link-down, scale, ...) as a hop."""
    import msgspec

    try:
        data = msgspec.to_builtins(decode(rec.type, rec.payload))
        data.pop("type", None)
    except Exception:  # a type this process cannot import: named, not decoded
        data = {}
    return {"t": rec.t, "actor": rec.actor, "event": "Fault", "src": rec.src, "fault": rec.type, "fields": data}


def _with_faults(hops: list[dict[str, Any]], faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The faults injected while the request was in the system, and the last few before it came
    (a link down before it is as much a cause), merged in by time: what an SRE looks for first
    when a request failed (a tour: why said a TE "left the colocated group", not that it had
    been killed 4 s before)."""
    start, end = hops[0]["t"], hops[-1]["t"]
    used = {h.get("te") for h in hops} | {(h.get("decision") or {}).get("chosen") for h in hops}
    control = [f for f in faults if f["event"] == "Control" and f["te"] in used and start <= f["t"] <= end
               and not (f["kind"] == "TeReady" and f["generation"] == 1)]  # fmt: skip
    faults = [f for f in faults if f["event"] == "Fault"]
    shown = [f for f in faults if f["t"] < start][-FAULTS_BEFORE:] + [f for f in faults if start <= f["t"] <= end]
    shown += control
    # stable: log order at a tie, but the control plane's decision first (it caused the hops beside it)
    return sorted([*hops, *shown], key=lambda h: (h["t"], h["event"] != "Control")) if shown else hops


def why_lines(hops: list[dict[str, Any]]) -> Iterator[str]:
    end = next((h for h in reversed(hops) if h["event"] in TERMINAL), None)
    own = next(h for h in hops if h["event"] != "Fault")
    rid = own["request_id"] if "request_id" in own else own["done"]["request_id"]
    if end is not None:
        d = end["done"]
        ttft = (f"TTFT {1e3 * (d['first_token_s'] - d['arrival_s']):.1f} ms, "
                if d["first_token_s"] is not None else "")
        yield (f"request {rid}: {d['status']} ({d['reason']}) — {ttft}JCT "
               f"{1e3 * (d['finish_s'] - d['arrival_s']):.1f} ms, {d['prompt_tokens']} prompt tokens "
               f"({d['cached_prompt_tokens']} cached), {d['output_tokens']} output tokens")
    elif (refused := next((h for h in hops if h["event"] == "GatewayRefused"), None)) is not None:
        yield f"request {rid}: refused (429) by the gateway, never admitted: {refused['reason']}"
    else:
        yield f"request {rid}: not terminal in this log"
    for h in hops:
        yield from _hop_lines(h)


def _hop_lines(h: dict[str, Any]) -> Iterator[str]:
    at, who, ev = f"t={h['t']:.6f}", h["actor"], h["event"]
    if ev == "GatewayRouted":
        dr = h["draw"]
        yield (f"{at}  gateway {who}: admitted ({h['inflight']}/{h['limit']} in flight for model "
               f"{h['model']!r}); JE {h['je']} drawn at random (index {dr['draw']} of "
               f"{', '.join(dr['candidates'])})")
    elif ev == "GatewayRefused":
        yield f"{at}  gateway {who}: refused (429): {h['reason']}"
    elif ev == "RouteDecided":
        yield from _decision_lines(at, who, h)
    elif ev == "OfferRefused":
        then = ("; for good (not busy): set aside, never offered this job again" if h.get("permanent")
                else "; busy: the next prefill is offered")
        yield (f"{at}  {who}: {h['te']} refused {h['task_id']}: {h['reason']}{then}" if h["te"]
               else f"{at}  {who}: every prefill refused this sweep; offering again after a pause")
    elif ev == "PrefillWaiting":
        yield (f"{at}  {who}: waits in the JE{' at the head of the queue' if h['front'] else ''} "
               f"({h['reason']}): offered again when a prefill frees a slot, a sweep, or the TTFT deadline")
    elif ev == "RouteQueued":
        yield from _decision_lines(at, who, h, f"queued, not offered: {h['reason']}")
    elif ev == "JeTaskEnded" and h["status"] != "completed":
        yield f"{at}  {who}: task {h['task_id']} on {h['te']} {h['status']}: {h['reason']}"
    elif ev == "MigrationAsked":
        yield f"{at}  {who}: task {h['task_id']} lost on {h['from_te']}: asked the frontend how far its stream got"
    elif ev == "TaskMigrated":
        c = h["choice"]
        off = f"off {h['from_te']}" if h["from_te"] else f"here, moved by the gateway ({h['failure']})"
        yield (f"{at}  {who}: MIGRATED {off} by {c['mode']}: {c['reason']} ({c['kv_bytes']} KV bytes); "
               f"the stream resumes at output token {h['resume_from']} ({h.get('basis') or 'the chunks the JE saw'}; "
               "what its client has already is not sent again)")
    elif ev == "JobCancelRequested":  # when the client gave up (TTFT deadline, disconnect, stop)
        then = "it ends completed (a stop sequence)" if h["completed"] else "cancelling its task"
        yield f"{at}  {who}: cancel requested: {h['reason']}; {then}"
    elif ev == "JePrefilled":
        yield f"{at}  {who}: prefill done ({h['cached_prompt_tokens']}/{h['prompt_tokens']} prompt tokens cached)"
    elif ev == "RequestDispatched":
        yield (f"{at}  workload stand-in {who}: {h['phase']} task attempt {h['attempt']} -> {h['te']} "
               f"(round robin over the role's TEs; no scheduling policy configured)")
    elif ev == "RequestPrefilled":
        yield (f"{at}  {who}: prefill done ({h['cached_prompt_tokens']} prompt tokens cached); "
               "KV registered for the decode side")
    elif ev == "Control" and h["kind"] == "TeDeclaredFailed":
        why = f" ({h['diagnosis']})" if h.get("diagnosis") else ""
        yield f"{at}  CONTROL {who}: {h['te']} generation {h['generation']} declared failed{why}: {h['reason']}"
    elif ev == "Control" and h["kind"] == "LadderChose":
        yield f"{at}  CONTROL {who}: recovery ladder ({h['rung']}) for {h['te']} generation {h['generation']}: {h['action']}"
    elif ev == "Control":
        yield f"{at}  CONTROL {who}: {h['te']} generation {h['generation']} ready (its replacement, booted cold)"
    elif ev == "Fault":
        fields = ", ".join(f"{k}={v}" for k, v in h["fields"].items())
        yield f"{at}  FAULT ({h['src']}) -> {who}: {h['fault']}{' ' + fields if fields else ''}"
    elif ev in TERMINAL:
        d = h["done"]
        yield f"{at}  {who}: {d['status']} on {d['te'] or '-'}: {d['reason']}"


def _decision_lines(at: str, who: str, h: dict[str, Any], queued: str = "") -> Iterator[str]:
    d = h["decision"]
    params = ", ".join(f"{k}={v:g}" for k, v in sorted(d["params"].items()))
    policy = f"[policy {d['policy']}{' (' + params + ')' if params else ''}]"
    if queued:
        yield f"{at}  JE {who}: the policy chose {d['chosen']} ({d['subgroup']}) {policy}; {queued}"
    else:
        # the task id is the decision's id: `replay whatif --at-decision ID --choose TE` forks there
        yield f"{at}  JE {who}: {h['phase']} task {h['task_id']} -> {d['chosen']} {policy}; decision id {h['task_id']}"
    yield f"{'':14}why: {d['reason']}"
    facts = []
    if d.get("heatmap_cell"):
        c = d["heatmap_cell"]
        facts.append(f"heatmap cell prefill>={c['prefill_tokens_lo']} ratio>={c['ratio_lo']:g} = {c['value']:+.3f}")
    if d.get("predicted_bucket") is not None:
        facts.append(f"predicted decode bucket {d['predicted_bucket']} (x128 tokens)")
    if d.get("decode_ratio") is not None:
        facts.append(f"decode/prefill ratio used {d['decode_ratio']:.3f}")
    if d.get("imbalance") is not None:
        facts.append(f"load imbalance {d['imbalance']}")
    if facts:
        yield f"{'':14}inputs: " + "; ".join(facts)
    keys = [k.lstrip("-") for k in d.get("order_by") or ()]
    ranked = d["ranked"]
    yield (f"{'':14}candidates, best first (ordered by {', '.join(keys) or 'turn'}):  rank  TE  subgroup  "
           "open tasks  prefix blocks  [decode side's open tasks]")
    for k, r in enumerate(ranked, 1):
        mark = "  <- chosen" if r["te"] == d["chosen"] else ""
        if k > 1 and keys and all(r[f] == ranked[0][f] for f in keys):
            mark = "  = tie with the chosen"
        dec = f"  decode {r['decode_load']:>4}" if r.get("decode_load") else ""
        yield (f"{'':16}{k:>3}. {r['te']:<12} {r['subgroup']:<9} load {r['load']:>4}  prefix "
               f"{r['prefix_blocks']:>5}{dec}{mark}")
    if ranked:
        yield f"{'':14}{_margin(ranked, keys)}"
    for e in d.get("excluded") or ():
        for te in e["tes"]:
            yield f"{'':16}not ranked: {te:<12} {e['subgroup']:<9} {e['reason']}"


def _margin(ranked: list[dict[str, Any]], keys: list[str]) -> str:
    """How far the chosen TE was ahead of the runner-up on the fields the order compares."""
    if len(ranked) < 2:
        return "the only candidate"
    a, b = ranked[0], ranked[1]
    if not keys:
        return f"runner-up {b['te']}: the order compares no score (the turn decided)"
    for f in keys:
        if a[f] != b[f]:
            return f"margin to the runner-up {b['te']}: {f} {a[f]} vs {b[f]}"
    return f"tie with the runner-up {b['te']} on {', '.join(keys)}: broken by TE name"
