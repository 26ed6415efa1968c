"""One DP group's master: FlowServe's scheduler loop, output path, prefetch cost model, PD hooks
and context caching (actor.py describes the loop).

A regular package, not a PEP 420 namespace one, so that the import graph holds its modules:
tests/test_layers.py checks their imports like every other module's.
"""
