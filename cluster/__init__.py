"""The one assembly (DESIGN.md, Layout): a cluster built from one config into a driver — the same
for `deepserve sim` (SimDriver + a trace) and `deepserve up` (AsyncDriver + the HTTP frontend).
Named `cluster`, not `platform`: a top-level `platform/` shadows the standard library's
`platform` module for any Python started in the repository root (pytest included)."""
