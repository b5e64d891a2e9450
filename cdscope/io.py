"""Parquet outputs with run metadata, written atomically.

Every file cdscope writes is a plain Parquet table that ``pandas.read_parquet`` loads,
with the run metadata (model names, revisions, probe hash, seeds, n, dtype, device,
cdscope version, command line, ...) as JSON under the ``cdscope`` key of the file's
key-value metadata. Writes go to a temporary file in the target folder and are renamed
into place, so a crash or Ctrl-C never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from cdscope.errors import CdscopeError, option
from cdscope.schemas import arrow_table, strict_json
from cdscope.version import __version__

METADATA_KEY = b"cdscope"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compute_threads() -> int | None:
    """torch's intra-op thread count when torch is loaded (a run that only reads files
    computes nothing in torch): reductions split over threads round differently, so it is
    part of what makes a number bit-exact (docs/resume.md)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def run_metadata(command: str, **fields: object) -> dict:
    """The metadata every output carries, plus command-specific ``fields``: the library
    versions and thread count that ``--resume`` compares (docs/resume.md)."""
    return {
        "command": command,
        "command_line": shlex.join(["cdscope", *sys.argv[1:]]) if sys.argv else "",
        "cdscope_version": __version__,
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "numpy_version": _version("numpy"),
        "python_version": platform.python_version(),
        "threads": compute_threads(),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **fields,
    }


def make_parents(target: Path) -> list[Path]:
    """Create the missing folders above ``target``; return those created, deepest first.
    When one cannot be made (a full disk, a read-only file system), those made before it
    are removed and the ``OSError`` propagates."""
    made, folder = [], target.parent
    while not folder.exists():
        made.append(folder)
        folder = folder.parent
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_empty(made)
        raise
    return made


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty: what a failed write or
    check made and did not fill (a failed run leaves no empty ``results/``)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (another writer's file) or gone: its parents stay too


def content_hash(value: object) -> str:
    """``sha256:`` + 16 hex digits of ``value`` as canonical JSON (sorted keys): the
    identity of a task, a task set or a file's records, whatever path they came from."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def check_writable(path: str | Path) -> Path:
    """Fail early (before any expensive work) when ``path`` cannot be written. Folders
    made for the check are removed again: the write that follows makes them."""
    target = Path(path)
    if target.exists() and target.is_dir():
        raise CdscopeError(
            f"output path {target} is a directory; give a file name like {target}/out.parquet"
        )
    made: list[Path] = []
    try:
        made = make_parents(target)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".cdscope-check-"):
            pass
    except OSError as exc:
        raise CdscopeError(f"cannot write to {target}: {exc.strerror or exc}") from exc
    finally:
        remove_empty(made)
    return target


#: suffixes of formats cdscope does not write: an output named so would be Parquet under a
#: name that says otherwise (``-o x.csv`` once wrote Parquet into x.csv, silently)
OTHER_FORMATS = frozenset((
    ".csv", ".tsv", ".txt", ".json", ".jsonl", ".xlsx", ".xls", ".feather", ".arrow", ".pkl",
    ".pickle", ".h5", ".hdf5", ".npy", ".npz", ".html", ".png", ".pdf", ".svg",
))  # fmt: skip


def check_parquet_output(path: str | Path) -> Path:
    """``check_writable`` for a Parquet output (``--out`` of probe, the audits, nsweep,
    random-ref, gradcheck, eap-info), refusing a name whose suffix is another format."""
    target = Path(path)
    if target.suffix.lower() in OTHER_FORMATS:
        parquet = target.with_suffix(".parquet").name
        raise CdscopeError(
            f"{option('out')} {target}: cdscope writes Parquet, not {target.suffix.lower()[1:]}; "
            f"name it {parquet} (pandas.read_parquet reads it, to convert)"
        )
    return check_writable(target)


def check_plot_path(path: Path) -> str:
    """The figure format from ``--plot``'s suffix (png, pdf, svg), or a one-line refusal."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in ("png", "pdf", "svg"):
        raise CdscopeError(
            f"{option('path', flag='--plot')} must end in .png, .pdf or .svg; got {Path(path).name}"
        )
    check_writable(path)
    return suffix


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


#: ``failure_reason``'s word for a full disk (ENOSPC in any writer's words)
DISK_FULL = "disk full"


class WriteFailed(CdscopeError):
    """An output could not be written; the temporary file or folder is already removed."""

    def __init__(self, target: Path, reason: str) -> None:
        self.target, self.reason = target, reason
        fix = "free space or choose" if reason == DISK_FULL else "choose"
        super().__init__(
            f"could not write {target} ({reason}); nothing was left there: "
            f"{fix} another output path"
        )


def failure_reason(exc: BaseException) -> str:
    """'disk full' for ENOSPC in any writer's words (OSError, safetensors, Arrow), else the
    first line of the error."""
    text = str(exc).strip()
    if getattr(exc, "errno", None) == errno.ENOSPC or any(
        word in text for word in ("No space left", "StorageFull", "os error 28")
    ):
        return DISK_FULL
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _failed(target: Path, exc: BaseException) -> BaseException:
    """What an atomic write re-raises: Ctrl-C and our own errors as they are, any other
    exception of the writer (OSError, safetensors' SafetensorError, Arrow errors, ...)
    as one ``WriteFailed`` line."""
    if isinstance(exc, CdscopeError) or not isinstance(exc, Exception):
        return exc
    return WriteFailed(target, failure_reason(exc))


def atomic_write_bytes(path: str | Path, write: object) -> None:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path``.

    On any failure the temporary file is removed and ``path`` keeps its old content;
    writer errors become a one-line ``WriteFailed`` (see ``_failed``).
    """
    target = Path(path)
    tmp, made = None, []
    try:
        made = make_parents(target)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)  # type: ignore[operator]
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        remove_empty(made)
        failure = _failed(target, exc)
        if failure is exc:
            raise
        raise failure from exc


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``path``; when the block ends without error
    it replaces ``path``, otherwise it is removed and writer errors become ``WriteFailed``."""
    target = Path(path)
    tmp, made = None, []
    try:
        made = make_parents(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)
        failure = _failed(target, exc)
        if failure is exc:
            raise
        raise failure from exc


#: rows per Parquet row group: a probe at neuron granularity (K ~ 10^5..10^6 gates per
#: family) is read and written group by group, not as one block
ROW_GROUP_ROWS = 65_536


def write_parquet(frame: pd.DataFrame, path: str | Path, metadata: dict) -> Path:
    """Write ``frame`` with ``metadata`` (strict JSON) atomically, in row groups of
    ``ROW_GROUP_ROWS``, each column in its ``cdscope.schemas`` type; returns the path."""
    table = arrow_table(frame)  # every column in its one Arrow type (cdscope.schemas)
    merged = {
        **(table.schema.metadata or {}),
        METADATA_KEY: json.dumps(strict_json(metadata), allow_nan=False).encode(),
    }
    table = table.replace_schema_metadata(merged)
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS))
    return Path(path)


def rows_up_to(path: str | Path, until: int | None, column: str = "step") -> pd.DataFrame:
    """The rows of cdscope Parquet ``path`` whose ``column`` is at most ``until`` (what a
    resumed run keeps of an earlier invocation's per-step file); empty when ``until`` is
    None or there is no file."""
    if until is None or not Path(path).is_file():
        return pd.DataFrame()
    frame = read_parquet(path)[0]
    return frame[frame[column] <= until].reset_index(drop=True)


def read_parquet(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Load a cdscope Parquet file: (frame, metadata). One-line error if it is not one."""
    source = Path(path)
    if not source.is_file():
        raise CdscopeError(f"file not found: {source}")
    try:
        table = pq.read_table(source)
        frame = table.to_pandas()
    except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad pandas metadata
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CdscopeError(f"{source} is not a readable Parquet file: {first}") from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise CdscopeError(f"{source} has no cdscope metadata: it was not written by cdscope")
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CdscopeError(f"{source}: its cdscope metadata is not valid JSON ({exc})") from exc
    if not isinstance(metadata, dict):
        raise CdscopeError(f"{source}: its cdscope metadata is not a JSON object")
    return frame, metadata


def jsonl_lines(path: Path, what: str, empty: str) -> list[tuple[str, str]]:
    """``(line, "file:line")`` for every non-blank line of the JSONL file ``path`` (task
    files, probe pools); a one-line CdscopeError when it is missing, unreadable or has no
    such line (``{what} file {path} has {empty}``)."""
    if not path.is_file():
        raise CdscopeError(f"{what} file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CdscopeError(f"cannot read {what} file {path}: {exc}") from exc
    found = [(line, f"{path}:{n}") for n, line in enumerate(lines, start=1) if line.strip()]
    if not found:
        raise CdscopeError(f"{what} file {path} has {empty}")
    return found


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
