"""Reading logs: exact re-execution, state at a time, listings, digests."""

from .common import ReplayError
from .digest import digest
from .listing import listing, listing_records
from .state import ActorState, state_at
from .verify import Divergence, VerifyResult, verify

__all__ = [
    "ActorState", "Divergence", "ReplayError", "VerifyResult", "digest", "listing",
    "listing_records", "state_at", "verify",
]
