"""Emulated hardware as actors: NPUs, the fabric (links), hosts (DRAM page cache, SSD, loading),
and the topologies that wire them (Gen1 cluster, CloudMatrix384 SuperPod).

They implement the ports in `deepserve.actors.ports`; every duration comes from the performance
model in `deepserve.adapters.hardware` (compute, transfer, fairshare, loading).
"""
