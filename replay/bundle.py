"""Incident bundles: a run's log(s), resolved config, code version and a README in one file.

`replay bundle LOG_OR_RUN_DIR -o incident.tar.gz` (issue 32 §5) packs what another person needs
to replay an incident elsewhere; `replay verify|why|state|...` open a bundle directly. A bundle is
data: it is unpacked with tarfile's "data" filter (no links out, no device files, no absolute
paths), only `*.db` logs are taken from a run directory, and its manifest is checked before any
log is read, so a bundle from another deepserve gets one precise line about what differs.
"""

from __future__ import annotations

import atexit
import io
import json
import re
import shutil
import sqlite3
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from deepserve.core.codeid import CODE_VERSION, RELEASE
from deepserve.persistence.schema import SCHEMA_VERSION

from .common import ReplayError

FORMAT = "deepserve-incident-bundle"
BUNDLE_VERSION = 1
MANIFEST = "MANIFEST.json"
MAX_MEMBERS = 4096  # a run directory holds one log per process, not thousands
MAX_UNPACKED_BYTES = 64 << 30  # a bundle is a log, not a disk image
REDACTED = "<redacted>"
# Config keys whose values are secrets wherever they sit (the daemon redacts its own admin token
# before logging its config; a bundle redacts again, for logs written by other code or versions).
_SECRET_KEY = re.compile(r"(^|_)(token|secret|password|passwd|api_key|apikey|credentials?)$", re.I)


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: str
    bundle_version: int
    release: str  # deepserve's release that made the bundle
    code_version: str  # its source hash (core/codeid.py)
    log_schema_version: int
    created_at: float
    source: str  # the log's or run directory's name where it was bundled
    logs: tuple[str, ...]  # paths inside the bundle, under logs/
    runs: tuple[dict[str, Any], ...]  # per run: run_id, mode, seed, the code that wrote it


def _log_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.is_file() and p.suffix == ".db")
        if files:
            return files
        raise ReplayError(f"{source}: no *.db log in this directory (a run directory holds one per process)")
    raise ReplayError(f"{source}: no such log file or run directory")


def _copy_log(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite log (its WAL folded in) through SQLite's backup API, read-only."""
    try:
        with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as s, sqlite3.connect(dst) as d:
            s.backup(d)
    except sqlite3.DatabaseError as exc:
        raise ReplayError(f"{src}: not a readable SQLite log ({exc})") from None


def _runs(log: Path) -> list[dict[str, Any]]:
    try:
        with sqlite3.connect(f"file:{log}?mode=ro", uri=True) as c:
            rows = c.execute("SELECT run_id, mode, seed, config, code_version, process FROM runs ORDER BY id").fetchall()
    except sqlite3.DatabaseError as exc:
        raise ReplayError(f"{log.name}: not a deepserve log ({exc})") from None
    return [{"run_id": r[0], "mode": r[1], "seed": r[2], "config": r[3], "code_version": r[4], "process": r[5]}
            for r in rows]  # fmt: skip


def without_secrets(value: Any) -> Any:
    """`value` (config data) with every secret-named key's non-empty value replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and v not in ("", None) else without_secrets(v))
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [without_secrets(v) for v in value]
    return value


def make_bundle(source: Path, out: Path) -> Manifest:
    """Pack `source` (a log file or a run directory) into the gzipped tar `out`."""
    if not out.parent.is_dir():
        raise ReplayError(f"-o {out}: directory {out.parent} does not exist")
    logs = _log_files(source)
    runs: list[dict[str, Any]] = []
    configs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ds-bundle-") as tmp:
        names = []
        for log in logs:
            copy = Path(tmp) / log.name
            _copy_log(log, copy)
            for run in _runs(copy):
                configs.setdefault(run["run_id"], without_secrets(json.loads(run.pop("config") or "{}")))
                runs.append(run)
            names.append(f"logs/{log.name}")
        if not runs:
            raise ReplayError(f"{source}: the log holds no run")
        manifest = Manifest(format=FORMAT, bundle_version=BUNDLE_VERSION, release=RELEASE, code_version=CODE_VERSION,
                            log_schema_version=SCHEMA_VERSION, created_at=time.time(), source=source.name,
                            logs=tuple(names), runs=tuple(runs))  # fmt: skip
        with tarfile.open(out, "w:gz") as tar:
            _add_bytes(tar, MANIFEST, msgspec.json.format(msgspec.json.encode(manifest), indent=2))
            _add_bytes(tar, "config.json", json.dumps(configs, indent=2, sort_keys=True).encode())
            _add_bytes(tar, "README.md", _readme(manifest, source).encode())
            for log, name in zip(logs, names, strict=True):
                tar.add(Path(tmp) / log.name, arcname=name)
    return manifest


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def _readme(m: Manifest, source: Path) -> str:
    target = "logs/" if source.is_dir() else m.logs[0]
    run_lines = "\n".join(f"- `{r['run_id']}` ({r['mode']}, seed {r['seed']}, process {r['process'] or 'main'}, "
                          f"written by {r['code_version']})" for r in m.runs)  # fmt: skip
    return f"""# deepserve incident bundle: {m.source}

Made by deepserve {m.release} (code {m.code_version}); log schema {m.log_schema_version}.

## Runs
{run_lines}

## Replay it
Every `deepserve replay` command takes this file as it is:

    deepserve replay verify THIS.tar.gz        # re-execute every actor from its logged inputs
    deepserve replay why THIS.tar.gz REQUEST   # one request's path and what decided each hop
    deepserve replay state THIS.tar.gz --cluster --at T

Or unpack it (`tar xzf`) and point them at `{target}`. `config.json` holds each run's resolved
config with secrets replaced by `{REDACTED}`; `MANIFEST.json` says which code wrote the logs.
A deepserve whose code differs may replay differently where that code changed: `replay verify`
says where.
"""


def is_bundle(path: str) -> bool:
    """True for a gzipped tar (by its magic bytes, not its name)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_bundle(path: str) -> tuple[str, Manifest, str]:
    """Unpack a bundle into a private temporary directory (removed at exit); return the path to
    replay (its one log, or its logs directory), its manifest, and a note when the bundle was
    made by other code ("" when it is this code's)."""
    manifest = read_manifest(path)
    tmp = Path(tempfile.mkdtemp(prefix="ds-bundle-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    with tarfile.open(path, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("logs/") and m.isfile()]
        if {m.name for m in members} != set(manifest.logs):
            raise ReplayError(f"{path}: its logs differ from what its {MANIFEST} lists (the bundle was changed "
                              "after it was made)")  # fmt: skip
        tar.extractall(tmp, members=members, filter="data")
    logs = tmp / "logs"
    target = str(logs / Path(manifest.logs[0]).name) if len(manifest.logs) == 1 else str(logs)
    note = ""
    if manifest.code_version != CODE_VERSION:
        note = (f"note: bundle made by deepserve {manifest.release} (code {manifest.code_version}); this is "
                f"{CODE_VERSION}: a replay may diverge where the code differs")  # fmt: skip
    return target, manifest, note


def read_manifest(path: str) -> Manifest:
    """The bundle's manifest, checked for format and compatibility before anything is unpacked."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            if len(members) > MAX_MEMBERS or sum(m.size for m in members) > MAX_UNPACKED_BYTES:
                raise ReplayError(f"{path}: too large for an incident bundle ({len(members)} members)")
            try:
                f = tar.extractfile(MANIFEST)
            except KeyError:
                f = None
            if f is None:
                raise ReplayError(f"{path}: a gzipped tar without {MANIFEST}: not a deepserve incident bundle")
            raw = f.read(1 << 20)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ReplayError(f"{path}: not a readable bundle ({exc})") from None
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except msgspec.ValidationError as exc:
        raise ReplayError(f"{path}: {MANIFEST}: {exc}") from None
    except msgspec.DecodeError:
        raise ReplayError(f"{path}: {MANIFEST} is not JSON") from None
    check_compatible(path, manifest)
    return manifest


def check_compatible(path: str, m: Manifest) -> None:
    if m.format != FORMAT:
        raise ReplayError(f"{path}: {MANIFEST}: format {m.format!r}, not {FORMAT!r}")
    if m.bundle_version > BUNDLE_VERSION:
        raise ReplayError(f"{path}: bundle format version {m.bundle_version}, made by deepserve {m.release}; this "
                          f"deepserve ({RELEASE}) reads bundle versions up to {BUNDLE_VERSION}: open it with a newer deepserve")  # fmt: skip
    if m.log_schema_version > SCHEMA_VERSION:
        raise ReplayError(f"{path}: its logs have schema {m.log_schema_version} (deepserve {m.release}, code "
                          f"{m.code_version}); this deepserve reads schema up to {SCHEMA_VERSION}: open it with "
                          f"deepserve {m.release} or newer")  # fmt: skip
    if m.log_schema_version < SCHEMA_VERSION:
        raise ReplayError(f"{path}: its logs have schema {m.log_schema_version} (deepserve {m.release}); this "
                          f"deepserve reads schema {SCHEMA_VERSION}: unpack it (tar xzf) and run "
                          f"`deepserve replay migrate` on the log, or open it with deepserve {m.release}")  # fmt: skip
    if not m.logs or any(not n.startswith("logs/") or "/" in n[5:] or not n.endswith(".db") for n in m.logs):
        raise ReplayError(f"{path}: {MANIFEST}: logs must be logs/NAME.db, got {list(m.logs)[:3]}")
