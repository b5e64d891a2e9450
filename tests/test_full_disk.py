"""A full disk or a read-only file system under an output (issue #40, item 3): every
writing command says one line and exits 2, and leaves no lock file and no empty folder.

The lock (``cdscope.lock``) is the first thing a run writes, so it is where these cases
meet the disk: ENOSPC / EROFS are injected at its folder, its open and its write; then the
same cases on real file systems -- a full and a read-only tmpfs, mounted in a user and
mount namespace (``unshare -rm``, no root needed where the kernel allows it; skipped
elsewhere).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdscope import io as cio
from cdscope import lock as lk
from cdscope.fileset import FileSet
from cdscope.io import WriteFailed
from cdscope.lock import OutputLock, lock_path
from tests.helpers import invoke, refused, write_eval_tasks

ROOT = Path(__file__).resolve().parents[1]
ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EROFS = OSError(errno.EROFS, "Read-only file system")


def fails_with(error: OSError):  # noqa: ANN201 - a replacement for an os function
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    return fail


def nothing_left(folder: Path) -> None:
    """No file and no folder under ``folder`` (it was empty before the run)."""
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert not left, f"left behind: {left}"


# -- the lock alone ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "error", "reason"),
    [
        ("pwrite", ENOSPC, "disk full"),  # a full disk: the file is made, its record is not
        ("open", EROFS, "Read-only file system"),  # read-only: not even the file
        ("open", ENOSPC, "disk full"),  # no inode left
    ],
)
def test_a_lock_that_cannot_be_written_is_one_line_and_leaves_nothing(
    tmp_path, monkeypatch, where, error, reason
) -> None:
    target = tmp_path / "new" / "deeper" / "out.parquet"
    monkeypatch.setattr(lk.os, where, fails_with(error))
    with pytest.raises(WriteFailed) as raised:
        OutputLock(target).acquire()
    message = str(raised.value)
    assert message.startswith(f"could not write {target} ({reason})")
    assert ("free space" in message) == (reason == "disk full")  # no bad advice for EROFS
    assert "\n" not in message
    monkeypatch.undo()
    nothing_left(tmp_path)  # no lock file, and neither folder made for it
    with OutputLock(target):  # nothing half-held: the lock can be taken once the disk is back
        assert lock_path(target).is_file()


def test_a_folder_that_cannot_be_made_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The first folder is made, the second is refused: the first is removed again."""
    target = tmp_path / "a" / "b" / "out.parquet"
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):  # noqa: ANN001, ANN202
        if Path(path).name == "b":
            raise EROFS
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(WriteFailed, match=r"\(Read-only file system\); nothing was left there"):
        OutputLock(target).acquire()
    nothing_left(tmp_path)


def test_an_output_set_names_its_primary_output(tmp_path, monkeypatch) -> None:
    """bshared locks OUT.convergence.parquet first (sorted): the line names OUT."""
    out = tmp_path / "b.parquet"
    monkeypatch.setattr(lk.os, "pwrite", fails_with(ENOSPC))
    with pytest.raises(WriteFailed, match=rf"could not write {out} \(disk full\)"):
        FileSet(out, tmp_path / "b.convergence.parquet").lock()
    nothing_left(tmp_path)


def test_the_held_record_is_dropped_when_the_lock_fails(tmp_path, monkeypatch) -> None:
    """A failed acquire must not leave the lock marked as held by this process (which
    would refuse every later writer of the output as 'a second writer')."""
    target = tmp_path / "o.parquet"
    monkeypatch.setattr(lk.os, "pwrite", fails_with(ENOSPC))
    with pytest.raises(WriteFailed):
        OutputLock(target).acquire()
    assert str(lock_path(target).resolve()) not in lk._HELD  # noqa: SLF001


# -- every writing command, in process -------------------------------------------------------
def commands(tmp_path: Path, model: Path) -> dict[str, list[object]]:
    tasks = write_eval_tasks(tmp_path.parent / f"{tmp_path.name}-tasks.jsonl")
    out = tmp_path / "out"
    return {
        "probe": ["probe", "--model", model, "--seeds", 1, "--out", out / "p.parquet"],
        "bshared": ["bshared", "--model", model, "--seeds", 1, "--out", out / "b.parquet"],
        "eval": ["eval", "--model", model, "--tasks", tasks, "--n", 1, "--out", out / "eval"],
        "train": ["train", "--model", model, "--preset", "cpu-smoke", "-o", out / "run"],
    }


@pytest.mark.parametrize("command", ["probe", "bshared", "eval", "train"])
@pytest.mark.parametrize(
    ("where", "error", "reason"),
    [("pwrite", ENOSPC, "disk full"), ("open", EROFS, "Read-only file system")],
)
def test_every_writing_command_refuses_a_disk_it_cannot_lock_on(
    tmp_path, monkeypatch, tiny_model_dir, command, where, error, reason
) -> None:
    """``os.open`` failing fails every file this process opens (as a read-only file
    system does): the early writability check may then be the one that says so."""
    args = commands(tmp_path, tiny_model_dir)[command]
    monkeypatch.setattr(lk.os, where, fails_with(error))
    line = refused(invoke(*args), reason)
    assert line.startswith(("error: could not write", "error: cannot write to")), line
    nothing_left(tmp_path)


def test_check_writable_still_catches_a_read_only_folder_first(tmp_path, monkeypatch) -> None:
    """The early check (before any model loads) is the one that names an unwritable
    folder when it can: its temporary file fails the same way."""
    monkeypatch.setattr(cio.tempfile, "NamedTemporaryFile", fails_with(EROFS))
    with pytest.raises(cio.CdscopeError, match="Read-only file system"):
        cio.check_writable(tmp_path / "x" / "o.parquet")
    nothing_left(tmp_path)


# -- real file systems -----------------------------------------------------------------------
UNSHARE = shutil.which("unshare")


def _namespaces_work() -> bool:
    if UNSHARE is None or sys.platform != "linux":
        return False
    probe = subprocess.run([UNSHARE, "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


MOUNT_SCRIPT = """
set -e
mode=$1; shift
if [ "$mode" = full ]; then
  mount -t tmpfs -o size=16k tmpfs "$MNT"
  dd if=/dev/zero of="$MNT/fill" bs=4k count=64 2>/dev/null || true
else
  mount -t tmpfs -o ro,size=16k tmpfs "$MNT"
fi
set +e
"$@"
rc=$?
echo "exit=$rc"
find "$MNT" -mindepth 1 ! -name fill -printf 'left:%P\\n'
"""


@pytest.mark.skipif(not _namespaces_work(), reason="no user + mount namespaces (unshare -rm)")
@pytest.mark.parametrize(
    ("mode", "command"),
    [
        ("full", "probe"),
        ("ro", "train"),  # before issue 40: a traceback at the lock, exit 1
        pytest.param("full", "bshared", marks=pytest.mark.slow),
        pytest.param("full", "eval", marks=pytest.mark.slow),
        pytest.param("full", "train", marks=pytest.mark.slow),
        pytest.param("ro", "probe", marks=pytest.mark.slow),
        pytest.param("ro", "bshared", marks=pytest.mark.slow),
        pytest.param("ro", "eval", marks=pytest.mark.slow),
    ],
)
def test_a_real_full_or_read_only_disk(tmp_path, tiny_model_dir, mode, command) -> None:
    mount = tmp_path / "mnt"
    mount.mkdir()
    args = [str(a) for a in commands(mount, tiny_model_dir)[command]]
    env = {**os.environ, "MNT": str(mount), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [UNSHARE, "-rm", "sh", "-c", MOUNT_SCRIPT, "sh", mode, sys.executable, "-m", "cdscope", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr
    reason = "disk full" if mode == "full" else "Read-only file system"
    assert reason in errors[0], errors[0]
    assert "exit=2" in run.stdout, (run.stdout, run.stderr)
    assert "left:" not in run.stdout, run.stdout  # no lock file, no empty folder
