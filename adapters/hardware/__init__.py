"""Emulated Ascend hardware: spec tables, model profiles and the performance model.

Pure functions only (the device actors live in `devices/`). See docs/hardware.md for every
constant and its source, docs/perf-model.md for the formulas and the calibration.
"""
