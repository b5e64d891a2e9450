"""An output set: every file one command writes, committed as one unit (docs/resume.md).

A command's outputs belong together: ``bshared`` writes ``OUT``, ``OUT.summary``,
``OUT.convergence``, ``OUT.probe`` and figures; ``eval`` a folder of Parquet files. A
reader must never see a mix of two runs, and a run that fails (full disk, Ctrl-C, a
refused input, ``kill -9``) must leave the earlier complete set as it was. So::

    with FileSet(out, sibling(out, "probe")) as outputs:   # locks each target (lock.py)
        outputs.write_parquet(frame, out, metadata)        # written into a staging folder
        draw(outputs.path(plot))                           # any writer, by path
    # leaving the block without an error commits: every staged file renamed into place

Files are written into a hidden staging folder beside each target folder
(``.PRIMARY.set-XXXX``, same file system, so the final renames are atomic), under their
final names, so a writer that derives sibling names from its path (a figure and its
``.units`` figure) stages them too. Committing writes a journal (``.PRIMARY.commit``)
listing the moves, renames every staged file, removes files made obsolete (the run's
``.partial`` progress file), then deletes the journal. A run killed between two renames
leaves the journal; the next writer of the same output finishes those renames before it
does anything else (every staged file was complete before the journal was written). An
error before the commit removes the staging folders: the old set is untouched.

Under a launcher only rank 0 writes: on other ranks the set is inert (nothing is locked,
written or committed). Rank 0 takes the locks when the work starts (``lock``), so that
``commands.parallel`` can hand a refusal to every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pandas as pd

from cdscope.distributed import launch_env
from cdscope.errors import CdscopeError
from cdscope.io import WriteFailed, atomic_write_bytes, make_parents, remove_empty, write_parquet
from cdscope.lock import OutputLock


def partial_path(out: Path) -> Path:
    """Where a multi-seed run keeps its progress until its set is complete:
    ``results/probe.parquet`` -> ``results/probe.partial.parquet`` (``--resume`` reads it)."""
    return out.with_name(f"{out.stem}.partial{out.suffix or '.parquet'}")


def _journal(primary: Path) -> Path:
    return primary.parent / f".{primary.name}.commit"


def _staging_prefix(primary: Path) -> str:
    return f".{primary.name}.set-"


def _move_all(staging: Path, folder: Path) -> None:
    for item in sorted(staging.iterdir()):
        os.replace(item, folder / item.name)
    staging.rmdir()


def finish_pending(primary: Path) -> None:
    """Complete a commit of ``primary``'s set that a killed run left half done, and remove
    staging folders of runs that never reached their commit (call with the lock held)."""
    journal = _journal(primary)
    if journal.is_file():
        try:
            plan = json.loads(journal.read_text(encoding="utf-8"))
            for staging, folder in plan.get("moves", []):
                if Path(staging).is_dir():
                    _move_all(Path(staging), Path(folder))
            for path in plan.get("remove", []):
                Path(path).unlink(missing_ok=True)
        except (OSError, ValueError, TypeError) as exc:
            raise CdscopeError(
                f"{primary}: the commit of an interrupted run's output set could not be "
                f"finished ({exc}); delete {journal} and rerun"
            ) from exc
        journal.unlink()
    if primary.parent.is_dir():
        for stale in primary.parent.glob(_staging_prefix(primary) + "*"):
            shutil.rmtree(stale, ignore_errors=True)


class FileSet:
    """The output files of one run, locked while it runs and committed together."""

    def __init__(self, *targets: str | Path | None) -> None:
        found = [Path(t) for t in targets if t is not None]
        if not found:
            raise ValueError("an output set needs at least one target")
        self.primary = found[0]
        self.targets = list(dict.fromkeys(found))
        self.id = uuid.uuid4().hex[:16]
        self._locks: list[OutputLock] = []
        self._staging: dict[Path, Path] = {}  # target folder -> its staging folder
        self._remove: list[Path] = []
        self._made: list[Path] = []  # folders staging created: removed on abort if empty
        self._scratch: Path | None = None  # inert sets: a private folder, discarded
        launch = launch_env()
        self.active = launch.is_main
        self._deferred = launch.active  # rank 0 of a launch locks when its work starts

    # -- locking ----------------------------------------------------------------------
    def lock(self) -> FileSet:
        """Lock every target (one line naming the holder if another run has one), then
        finish a commit a killed run left half done. Idempotent."""
        if not self.active or self._locks:
            return self
        try:
            for target in sorted(self.targets, key=str):
                self._locks.append(OutputLock(target).acquire())
            finish_pending(self.primary)
        except WriteFailed as exc:  # a lock file on a full or read-only disk: name the output
            self._release()
            raise WriteFailed(self.primary, exc.reason) from None
        except BaseException:
            self._release()
            raise
        return self

    def _release(self) -> None:
        for held in reversed(self._locks):
            held.release()
        self._locks = []

    # -- staging ----------------------------------------------------------------------
    def path(self, final: str | Path) -> Path:
        """Where to write ``final`` now: a file of the same name in the staging folder of
        ``final``'s folder (committed with the set)."""
        final = Path(final)
        if not self.active:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="cdscope-inert-"))
            return self._scratch / final.name
        self.lock()
        folder = final.parent
        if folder not in self._staging:
            self._made += make_parents(folder / "staged")
            staging = tempfile.mkdtemp(dir=folder, prefix=_staging_prefix(self.primary))
            self._staging[folder] = Path(staging)
        return self._staging[folder] / final.name

    def write_parquet(self, frame: pd.DataFrame, final: str | Path, metadata: dict) -> Path:
        """Stage ``frame`` as ``final`` (metadata gains ``output_set``: this set's id and
        primary file, the same in every file of the set)."""
        final = Path(final)
        tagged = {**metadata, "output_set": {"id": self.id, "primary": self.primary.name}}
        try:
            write_parquet(frame, self.path(final), tagged)
        except WriteFailed as exc:
            raise WriteFailed(final, exc.reason) from exc
        return final

    def remove_on_commit(self, path: str | Path) -> None:
        """``path`` (a progress file) is deleted once the set is committed."""
        self._remove.append(Path(path))

    # -- commit -----------------------------------------------------------------------
    def commit(self) -> None:
        """Rename every staged file into place (journalled), remove the obsolete files."""
        if not self.active:
            return
        self.lock()
        moves = [(staging, folder) for folder, staging in self._staging.items()]
        try:
            for staging, folder in moves:  # a folder left where a file should go
                for item in staging.iterdir():
                    if (folder / item.name).is_dir():
                        raise WriteFailed(folder / item.name, "a folder is in the way")
            if moves or self._remove:
                plan = {"moves": [[str(s), str(f)] for s, f in moves],
                        "remove": [str(p) for p in self._remove]}  # fmt: skip
                atomic_write_bytes(
                    _journal(self.primary), lambda tmp: Path(tmp).write_text(json.dumps(plan))
                )
            for staging, folder in moves:
                _move_all(staging, folder)
            for path in self._remove:
                path.unlink(missing_ok=True)
            _journal(self.primary).unlink(missing_ok=True)
        except OSError as exc:  # the journal stays: the next writer finishes the renames
            raise WriteFailed(self.primary, f"commit interrupted: {exc.strerror or exc}") from exc
        self._staging = {}

    def abort(self) -> None:
        """Remove everything staged; the files in place stay as they were."""
        for staging in self._staging.values():
            shutil.rmtree(staging, ignore_errors=True)
        self._staging = {}
        remove_empty(self._made)

    def __enter__(self) -> FileSet:
        if not self._deferred:
            self.lock()
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        try:
            if kind is None:
                self.commit()
            else:
                self.abort()
        finally:
            self._release()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
        if isinstance(exc, WriteFailed):
            self._rename_failure(exc)

    def _rename_failure(self, exc: WriteFailed) -> None:
        """A writer's failure on a staged path (a figure), reported under the final path."""
        staged = exc.target.parent
        if staged.name.startswith(_staging_prefix(self.primary)):
            raise WriteFailed(staged.parent / exc.target.name, exc.reason) from exc
