"""The daemon's own process sets its cyclic GC for serving once the cluster is up
(daemon/server.py `serving_gc`): start-up's objects frozen, young objects collected less often; a
program that embeds `serve` (own_gc False, the tests' in-process daemons) keeps its settings."""

from __future__ import annotations

import subprocess
import sys

from deepserve.daemon.server import SERVING_GC_GEN0_THRESHOLD


def test_serving_gc_freezes_start_up_and_raises_the_young_threshold() -> None:
    code = ("import gc; from deepserve.daemon.server import serving_gc; before = gc.get_threshold(); "
            "serving_gc(); print(gc.get_freeze_count(), *gc.get_threshold(), *before)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    frozen, gen0, gen1, gen2, b0, b1, b2 = map(int, out.stdout.split())
    assert frozen > 10_000  # the modules and objects start-up made
    assert gen0 == SERVING_GC_GEN0_THRESHOLD > b0 and (gen1, gen2) == (b1, b2)

