"""Reading logs: exact re-execution, state at a time, listings, digests, integrity."""

from .common import ReplayError
from .digest import digest
from .integrity import check_integrity
from .listing import check_filters, listing, listing_records
from .state import ActorState, state_at
from .verify import Divergence, VerifyResult, verify

__all__ = [
    "ActorState", "Divergence", "ReplayError", "VerifyResult", "check_filters", "check_integrity",
    "digest", "listing", "listing_records", "state_at", "verify",
]
