"""The completion routes without FastAPI's per-request layers (issue 30 §1, CPU per request).

A completion request on the FastAPI app passes ServerErrorMiddleware, FastAPI's exception
telemetry, body-limit and exit-stack middlewares, Starlette's ExceptionMiddleware, the router's
match over every route, the route's request handler (endpoint context, dependency solving), and
each of its ~20 body messages passes two send wrappers: ~6 % of the daemon's event-loop CPU
under `bench http`'s load (py-spy), for routes that read their body raw and raise nothing but
`HttpError` on purpose. `FastRoutes` sits in front of the app: a POST to one of its paths runs
that route's endpoint directly, with the app's own handling of what it raises (the handlers
`create_app` registers: `HttpError` as its OpenAI error, anything else as the 500 error body,
then raised on to the server, as ServerErrorMiddleware does); every other request goes to the
app unchanged. The routes stay declared on the app (the OpenAPI document, and the readable
version: tests/daemon/test_fastpath.py sends the same requests both ways and compares).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
OnError = Callable[[Request, Exception], Awaitable[Response]]


class FastRoutes:
    """`app` with `routes` (path -> POST endpoint) served directly; `errors`: exception class
    -> the app's handler for it, most specific first (`Exception` last)."""

    def __init__(self, app: ASGIApp, routes: dict[str, Endpoint], errors: list[tuple[type[Exception], OnError]]) -> None:
        self.app, self.routes, self.errors = app, routes, errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.routes.get(scope["path"])
            if endpoint is not None:
                await self._serve(endpoint, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.app  # what Starlette's Request.app reads, as the app sets it
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = next(h for cls, h in self.errors if isinstance(exc, cls))
            await (await handler(request, exc))(scope, receive, send)
            if not self._handled(exc):  # ServerErrorMiddleware's: answered, then raised on
                raise
            return
        await response(scope, receive, send)

    def _handled(self, exc: Exception) -> bool:
        """Whether a handler other than the catch-all one took `exc` (ExceptionMiddleware's)."""
        return any(cls is not Exception and isinstance(exc, cls) for cls, _h in self.errors)


def fast_routes(app: Any) -> Any:
    """The ASGI app to serve: `app` behind `FastRoutes` for the routes `create_app` put in
    `app.state.fast_routes` (with `app.state.fast_errors`), or `app` itself without any."""
    routes = getattr(app.state, "fast_routes", None)
    return FastRoutes(app, routes, app.state.fast_errors) if routes else app
