"""The SQLite backend (see `deepserve.persistence`'s docstring for the map).

Nothing is imported here: `child.py` runs as `python -m` in a child process and
must start without SQLAlchemy."""
