"""deepserve: serverless LLM serving as an event-logged actor system (README.md).

First, before any other deepserve module is imported: the compiled build of the hot modules,
when `make` built one from these very sources (compiled.py)."""

from deepserve.compiled import install as _install  # (absolute: pytest may import this file alone)

BUILD = _install()
