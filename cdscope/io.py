"""Parquet outputs with run metadata, written atomically.

Every file cdscope writes is a plain Parquet table that ``pandas.read_parquet`` loads,
with the run metadata (model names, revisions, probe hash, seeds, n, dtype, device,
cdscope version, command line, ...) as JSON under the ``cdscope`` key of the file's
key-value metadata. Writes go to a temporary file in the target folder and are renamed
into place, so a crash or Ctrl-C never leaves a half-written file.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from cdscope import __version__
from cdscope.errors import CdscopeError

METADATA_KEY = b"cdscope"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run_metadata(command: str, **fields: object) -> dict:
    """The metadata every output carries, plus command-specific ``fields``."""
    return {
        "command": command,
        "command_line": shlex.join(["cdscope", *sys.argv[1:]]) if sys.argv else "",
        "cdscope_version": __version__,
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "python_version": platform.python_version(),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **fields,
    }


def check_writable(path: str | Path) -> Path:
    """Fail early (before any expensive work) when ``path`` cannot be written."""
    target = Path(path)
    if target.exists() and target.is_dir():
        raise CdscopeError(
            f"output path {target} is a directory; give a file name like {target}/out.parquet"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".cdscope-check-"):
            pass
    except OSError as exc:
        raise CdscopeError(f"cannot write to {target}: {exc.strerror or exc}") from exc
    return target


def check_plot_path(path: Path) -> str:
    """The figure format from ``--plot``'s suffix (png, pdf, svg), or a one-line refusal."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in ("png", "pdf", "svg"):
        raise CdscopeError(f"--plot must end in .png, .pdf or .svg; got {Path(path).name}")
    check_writable(path)
    return suffix


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_bytes(path: str | Path, write: object) -> None:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)  # type: ignore[operator]
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(frame: pd.DataFrame, path: str | Path, metadata: dict) -> Path:
    """Write ``frame`` with ``metadata`` (JSON) atomically; returns the path."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    merged = {
        **(table.schema.metadata or {}),
        METADATA_KEY: json.dumps(metadata, default=str).encode(),
    }
    table = table.replace_schema_metadata(merged)
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))
    return Path(path)


def read_parquet(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Load a cdscope Parquet file: (frame, metadata). One-line error if it is not one."""
    source = Path(path)
    if not source.is_file():
        raise CdscopeError(f"file not found: {source}")
    try:
        table = pq.read_table(source)
    except (OSError, pa.ArrowInvalid) as exc:
        raise CdscopeError(f"{source} is not a readable Parquet file: {exc}") from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise CdscopeError(f"{source} has no cdscope metadata: it was not written by cdscope")
    return table.to_pandas(), json.loads(raw)


def json_record(line: str, where: str, required: Sequence[str]) -> dict:
    """One JSONL line -> a JSON object with every ``required`` key, or a one-line
    CdscopeError starting with ``where`` (``file:line``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CdscopeError(f"{where}: not valid JSON ({exc.msg})") from exc
    return require_keys(record, where, required)


def require_keys(record: object, where: str, required: Sequence[str], need: str = "") -> dict:
    """``record`` if it is a dict (a JSON object) holding every ``required`` key, else a
    one-line CdscopeError starting with ``where``; ``need`` replaces the default hint."""
    if not isinstance(record, dict):
        raise CdscopeError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in required if key not in record]
    if missing:
        raise CdscopeError(
            f"{where}: missing key(s) {', '.join(missing)} ({need or 'need ' + ', '.join(required)})"
        )
    return record
