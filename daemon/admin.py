"""The admin API (127.0.0.1 by default; a bearer token, required beyond loopback): status, faults and scaling.
Every fault and every scale request is an external input into the log (`src="ext/admin"`), so
replay re-injects it. `kill-te` kills the TE's pod for real (`KillPod`: its actors stop and answer
nothing, like a dead process); the heartbeat monitor notices and the cluster manager replaces it."""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepserve.actors.cluster.messages import ScaleGroup
from deepserve.actors.gateway.messages import JeLost
from deepserve.actors.ports.faults import HbmRegionFault, LinkDegrade, LinkDown, LinkUp, NpuHang
from deepserve.actors.ports.npu import DEFAULT_REGIONS
from deepserve.actors.ports.pod import KillPod
from deepserve.cluster.control import MANAGER_ADDR, PODS_ADDR
from deepserve.core.messages import Stop

from .api import error_body, route_error_body
from .auth import bearer_ok
from .logquery import MAX_ROWS, LogQueries
from .metrics import Metrics
from .runtime import Runtime, te_index

FABRIC = "hw/fabric"
HBM_REGIONS = DEFAULT_REGIONS  # what a TE allocates ("weights", "kv"): a fault elsewhere hits nothing


class Fault(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kind: Literal["kill-te", "kill-je", "hang-npu", "link-down", "link-up", "link-degrade", "hbm-fault"]
    target: str  # a TE ("te/0"), a JE ("je/1"), an NPU ("hw/s0/npu3") or a link ("s0/npu3/roce")
    bw_factor: float | None = None  # link-degrade only (default 0.5)
    region: str | None = None  # hbm-fault only: an HBM region the TEs use (`HBM_REGIONS`; default kv)


class Scale(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    group: str  # "model/role", e.g. "llama3-8b/colocated"
    size: int


def scale_input(rt: Runtime, sc: Scale) -> tuple[str, ScaleGroup, int]:
    """(address, message, current target) of a scale request; ValueError naming the field."""
    slots = sum(1 for s in rt.slots if s.group == sc.group)
    if not slots:
        groups = sorted({s.group for s in rt.slots})
        raise ValueError(f"group: no TE group {sc.group!r}; groups: {', '.join(groups)}")
    if not 0 <= sc.size <= slots:
        raise ValueError(f"size: must be in [0, {slots}] (the group's TE slots; control.spare_tes adds some), "
                         f"got {sc.size}")  # fmt: skip
    cm = rt.cluster_state()
    g = cm.groups.get(sc.group) if cm is not None else None
    _check_pd_partner(sc, cm.groups if cm is not None else {})
    return MANAGER_ADDR, ScaleGroup(group=sc.group, size=sc.size), g.target if g is not None else 0


PARTNER = {"prefill": "decode", "decode": "prefill"}


def _check_pd_partner(sc: Scale, groups: dict[str, Any]) -> None:
    """A PD pair needs both halves: a prefill group with no decode TE would take requests that
    fail after their first token (a user tour: 1 in 4 failed, the colocated TEs idle)."""
    model, _, role = sc.group.rpartition("/")
    other = f"{model}/{PARTNER[role]}" if role in PARTNER else ""
    partner = groups.get(other)
    if partner is None or (sc.size == 0) == (partner.target == 0):
        return
    if sc.size == 0:
        raise ValueError(f"size: 0 would leave {other}'s {partner.target} TE(s) without a {role} "
                         f"partner; scale {other} to 0 first")  # fmt: skip
    raise ValueError(f"size: {other} has no TE (target 0), so this group's requests could not "
                     f"finish; scale {other} up first")  # fmt: skip


def _param_of(exc: Exception) -> str | None:
    """The body field an error names: msgspec's `$.field`, or our "field: problem"."""
    text = str(exc)
    # a field missing or unknown is named by msgspec in backquotes (at the top level there is
    # no `$.path`: param was null for `{}` and for an unknown field, a user tour)
    named = re.match(r"Object (?:missing required|contains unknown) field `([^`]*)`(?: - at `\$\.?([^`]*)`)?", text)
    if named is not None:
        field, where = named.groups()
        return f"{where}.{field}" if where else field
    m = re.search(r"at `\$\.([\w.\[\]]+)`", text) if isinstance(exc, msgspec.ValidationError) else None
    if m is not None:
        return m.group(1)
    head, sep, _ = text.partition(":")
    return head if sep and head.isidentifier() else None


def fault_inputs(rt: Runtime, f: Fault) -> list[tuple[str, Any]]:
    """(address, message) of a fault; ValueError naming the field when it cannot apply."""
    for name, value, kind in (("bw_factor", f.bw_factor, "link-degrade"), ("region", f.region, "hbm-fault")):
        if value is not None and f.kind != kind:  # would be ignored: say so instead
            raise ValueError(f"{name}: only for {kind}, not {f.kind}")
    bw_factor = 0.5 if f.bw_factor is None else f.bw_factor
    region = "kv" if f.region is None else f.region
    if f.kind == "kill-te":
        _check_launched(rt, f.target)
        return [(PODS_ADDR, KillPod(te=f.target, reason=f"kill-te {f.target}"))]
    if f.kind == "kill-je":
        # as a scenario's kill-je: the JE stops, and the gateway learns it at once (its connection
        # to the JE broke); it moves the JE's jobs to another JE, streams too with migration on
        if f.target not in rt.jes:
            raise ValueError(f"target: no JE {f.target!r} (JEs: {', '.join(rt.jes)})")
        return [(f.target, Stop(by="ext/admin")),
                (rt.cfg.daemon.ingress, JeLost(je=f.target, reason=f"kill-je {f.target}"))]  # fmt: skip
    if f.kind in ("hang-npu", "hbm-fault"):
        npus = {n for t in rt.placement.tes for n in t.npus}
        if f.target not in npus:
            raise ValueError(f"target: no NPU {f.target!r} serves a TE (e.g. {sorted(npus)[0]})")
        if f.kind == "hbm-fault" and region not in HBM_REGIONS:
            raise ValueError(f"region: the TEs use HBM regions {', '.join(HBM_REGIONS)}; got {region!r}")
        msg = NpuHang(reason="admin hang-npu") if f.kind == "hang-npu" else HbmRegionFault(region=region)
        return [(f.target, msg)]
    links = rt.link_names()
    if f.target not in links:
        roce = [name for name in links if name.endswith("/roce")][:2]
        raise ValueError(f"target: no link {f.target!r} in the {rt.cfg.cluster.topology} topology "
                         f"(e.g. {', '.join(roce or links[:2])})")  # fmt: skip
    if f.kind == "link-degrade" and not 0 < bw_factor <= 1:
        raise ValueError(f"bw_factor: must be in (0, 1], got {bw_factor}")
    # link-up repairs a link: up, full bandwidth, no flapping (the fabric's LinkUp), so an
    # engineer can end a link fault without restarting the daemon
    msg2: Any = {"link-down": LinkDown(link=f.target), "link-up": LinkUp(link=f.target)}.get(f.kind)
    return [(FABRIC, msg2 or LinkDegrade(link=f.target, bw_factor=bw_factor))]


def _bad_limit(limit: int) -> JSONResponse:
    return JSONResponse(error_body(f"limit: must be in [1, {MAX_ROWS}], got {limit}",
                                   "invalid_request_error", "limit"), 400)  # fmt: skip


def _check_launched(rt: Runtime, te: str) -> None:
    """A TE that runs (or boots, or was declared failed): killing it is a fault to inject.
    A spare slot never launched, or a TE stopped by a scale-down, has no pod to kill."""
    cm = rt.cluster_state()
    launched = cm.tes if cm is not None else {}
    live = sorted((t for t, r in launched.items() if r.state != "stopped"), key=te_index)
    if te not in launched:
        spare = any(s.te == te for s in rt.slots)
        what = f"{te!r} is a spare slot, never launched" if spare else f"no TE {te!r}"
        raise ValueError(f"target: {what}; TEs: {', '.join(live)}")
    if launched[te].state == "stopped":
        raise ValueError(f"target: {te} is stopped (scaled down); TEs: {', '.join(live)}")


def create_admin_app(rt: Runtime, metrics: Metrics, token: str) -> FastAPI:
    app = FastAPI(title="deepserve admin")

    # Every error in the one (OpenAI) shape the rest of the API uses, not FastAPI's own
    @app.exception_handler(StarletteHTTPException)
    async def _on_route_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(route_error_body(exc.status_code, exc.detail), exc.status_code,
                            headers=getattr(exc, "headers", None))  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def _on_bad_param(_r: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        name = str(first.get("loc", ("", "?"))[-1])
        return JSONResponse(error_body(f"{name}: {first.get('msg', 'invalid')}", "invalid_request_error", name), 400)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        if token and not bearer_ok(request.headers.get("authorization", ""), token):
            return JSONResponse(error_body("missing or wrong bearer token", "authentication_error"), 401,
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return await call_next(request)

    @app.get("/admin/status")
    async def status() -> dict[str, Any]:
        return rt.status()

    queries = LogQueries.for_run_dir(rt.run_dir, rt.log_path)

    @app.get("/admin/requests/{request_id}")
    async def request_timeline(request_id: str, limit: int = MAX_ROWS) -> JSONResponse:
        """A request's first `limit` steps (at most 1,000) and their events, read from the run's
        live logs (SQLAlchemy async, aiosqlite); `truncated` says whether it has more."""
        if not 1 <= limit <= MAX_ROWS:
            return _bad_limit(limit)
        rows, truncated = await queries.request_timeline(request_id, limit)
        if not rows:
            return JSONResponse(error_body(f"no request {request_id!r} in the log (yet)", "not_found_error"), 404)
        return JSONResponse({"request_id": request_id, "steps": rows, "truncated": truncated})

    @app.get("/admin/faults")
    async def recent_faults(limit: int = 50) -> Any:
        if not 1 <= limit <= MAX_ROWS:
            return _bad_limit(limit)
        return {"inputs": await queries.recent_admin_inputs(limit)}

    @app.post("/admin/scale")
    async def scale(request: Request) -> JSONResponse:
        try:
            sc = msgspec.json.decode(await request.body(), type=Scale)
            dst, msg, was = scale_input(rt, sc)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            return JSONResponse(error_body(str(exc), "invalid_request_error", _param_of(exc)), 400)
        await rt.admin_input(dst, msg)
        return JSONResponse({"group": sc.group, "size": sc.size, "was": was})

    @app.post("/admin/fault")
    async def fault(request: Request) -> JSONResponse:
        try:
            f = msgspec.json.decode(await request.body(), type=Fault)
            inputs = fault_inputs(rt, f)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            return JSONResponse(error_body(str(exc), "invalid_request_error", _param_of(exc)), 400)
        for dst, msg in inputs:
            await rt.admin_input(dst, msg)
        metrics.faults.labels(f.kind).inc()
        return JSONResponse({"injected": [{"to": dst, "message": type(m).__name__} for dst, m in inputs]})

    return app
