"""Moved: the cluster manager is `actors/cluster/manager.py` (issue 7 §2). This path stays
importable for its users (`deepserve sim`'s scheduling wiring, tests)."""

from deepserve.actors.cluster.manager import ClusterManager
from deepserve.actors.cluster.messages import RemoveTe

__all__ = ["ClusterManager", "RemoveTe"]
