"""Reading logs: exact re-execution, state at a time, listings, digests, integrity.

Exports load on first use (PEP 562), as `deepserve.persistence`'s do: the CLI imports
`replay.common` for its error type on every command, and `integrity` brings in the log
factory and SQLAlchemy (~0.4 s), which `deepserve --help` or `deepserve bench` never use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.lazy import lazy_exports

if TYPE_CHECKING:
    from .common import ReplayError
    from .digests import digest
    from .integrity import check_integrity
    from .listings import check_filters, listing, listing_records
    from .state import ActorState, state_at
    from .verifier import Divergence, VerifyResult, verify

_EXPORTS = {
    "ReplayError": ".common",
    "digest": ".digests",
    "check_integrity": ".integrity",
    "check_filters": ".listings",
    "listing": ".listings",
    "listing_records": ".listings",
    "ActorState": ".state",
    "state_at": ".state",
    "Divergence": ".verifier",
    "VerifyResult": ".verifier",
    "verify": ".verifier",
}

__all__ = [
    "ActorState", "Divergence", "ReplayError", "VerifyResult", "check_filters", "check_integrity",
    "digest", "listing", "listing_records", "state_at", "verify",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
