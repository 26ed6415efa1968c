"""The Job Executor (issue 6): `actor.JobExecutor`, its messages, and the cluster-manager
stand-in `cluster.ClusterManager` that pushes TE group membership."""
