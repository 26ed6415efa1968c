"""The daemon (issue 7): `deepserve up` — the cluster on AsyncDriver, an OpenAI-compatible HTTP
frontend, an admin API, metrics. Single process; the ZeroMQ multi-process mode is another branch."""
