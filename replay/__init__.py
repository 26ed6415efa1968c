"""Reading logs: exact re-execution, state at a time, listings, digests."""

from .common import ReplayError
from .digest import digest
from .listing import listing, listing_records
from .state import ActorState, state_at
from .verify import Divergence, VerifyResult, verify

__all__ = [
    "ActorState", "Divergence", "ReplayError", "VerifyResult", "digest", "listing",
    "listing_records", "measure_verify", "state_at", "verify",
]


def __getattr__(name: str) -> object:
    # Imported on demand: the benchmark module defines message types, which
    # should not be registered in every process that merely reads a log.
    if name == "measure_verify":
        from .measure import measure_verify

        return measure_verify
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
