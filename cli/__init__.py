"""The `deepserve` command line: one module per command group, registered from main.COMMANDS.
Nothing below this package imports it (DESIGN.md, Layout)."""

from deepserve.cli.main import main

__all__ = ["main"]
