"""The `deepserve` command line: one module per command group, `main` wires them."""

from deepserve.cli.main import main

__all__ = ["main"]
