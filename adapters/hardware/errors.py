"""Errors of the hardware model: an unknown name is a lookup failure *and* bad input."""

from __future__ import annotations

from collections.abc import Iterable


class UnknownNameError(KeyError, ValueError):
    """A model/NPU/link/server name not in its table.

    It subclasses KeyError (it is a failed table lookup) and ValueError (it is bad input, so the
    CLI edge that catches ValueError reports it as one line). The message names the field and
    lists the known names, so the user can fix the typo without reading code.
    """

    def __init__(self, field: str, name: str, known: Iterable[str]) -> None:
        self.field = field
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"{field}: unknown {field} {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])
