"""The Job Executor (issue 6): `actor.JobExecutor` and its messages. The cluster manager that
pushes TE group membership is `actors/cluster/manager.py` (still importable as `je.cluster`)."""
