"""`deepserve chaos`: seeded random fault schedules over the whole platform in virtual time, with
invariants checked after every simulated step (TigerBeetle's VOPR, FoundationDB's simulation
testing). schedule.py draws a seed's faults, invariants.py checks a run, runner.py runs seeds."""
