"""The names of the logs in a run directory that holds one log per process (`deepserve up
--processes`): the daemon's own `daemon.db` and one `<log_name(pod)>.db` per TE process.

The writer (the daemon's process supervisor) and the readers (`replay verify` of a run
directory, which must tell a missing log from one never written) both follow this one rule, so
it lives with the store they share rather than in the daemon, which replay never imports.
"""

from __future__ import annotations


def log_name(pod_id: str) -> str:
    """"te/3#g2" -> "te-3-g2" (a file name in the run directory, and a socket name)."""
    return pod_id.replace("/", "-").replace("#", "-")
