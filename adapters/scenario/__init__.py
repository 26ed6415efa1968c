"""Scenarios for `deepserve sim`: the TOML schema and loader (with `--set` overrides), the
cluster builder, and the run loop that feeds a trace into a SimDriver."""
