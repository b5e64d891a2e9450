"""Output sets (issue #26): a run's files are committed together or not at all, a second
writer is refused with one line naming the holder, and a rerun leaves the complete
earlier output untouched until its own set is complete."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cdscope import fileset as fs
from cdscope import io as cio
from cdscope import lock as lk
from cdscope.cli import app
from cdscope.fileset import FileSet, partial_path
from cdscope.io import WriteFailed
from cdscope.lock import OutputBusy, OutputLock, lock_path
from tests.helpers import refused
from tests.test_faults import ENOSPC, no_leftovers, probe_file

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every visible file of ``folder`` and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- the set ---------------------------------------------------------------------------------
def test_a_set_is_committed_whole_and_an_error_leaves_the_old_set(tmp_path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "sub" / "b.parquet"
    with FileSet(a, b) as outputs:
        outputs.write_parquet(pd.DataFrame({"x": [1]}), a, {"run": 1})
        outputs.write_parquet(pd.DataFrame({"x": [1]}), b, {"run": 1})
        assert not a.exists() and not b.exists()  # nothing in place before the commit
    ids = {cio.read_parquet(p)[1]["output_set"]["id"] for p in (a, b)}
    assert len(ids) == 1  # the same set id in every file of the set
    before = {a: a.read_bytes(), b: b.read_bytes()}
    with pytest.raises(RuntimeError), FileSet(a, b) as outputs:
        outputs.write_parquet(pd.DataFrame({"x": [2]}), a, {"run": 2})
        raise RuntimeError("the run fails after its first file")
    assert {p: p.read_bytes() for p in before} == before
    no_leftovers(tmp_path)


def test_a_figure_and_the_siblings_its_writer_derives_are_staged_together(tmp_path) -> None:
    figure = tmp_path / "figs" / "fig.png"
    with FileSet(tmp_path / "o.parquet", figure) as outputs:
        staged = outputs.path(figure)
        staged.write_bytes(b"png")
        staged.with_name("fig.units.png").write_bytes(b"units")  # as draw_audit does
        assert staged.parent != figure.parent
    assert figure.read_bytes() == b"png" and (figure.parent / "fig.units.png").exists()
    no_leftovers(tmp_path)


def test_a_commit_cut_short_is_finished_by_the_next_writer(tmp_path, monkeypatch) -> None:
    """``kill -9`` between two renames of a commit: the journal lets the next writer of the
    same output finish it (every staged file was complete before the journal)."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    real = os.replace
    calls = []

    def dies_after_the_first_rename(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # the journal, then a, then (dead) b
            raise KeyboardInterrupt
        return real(src, dst)

    outputs = FileSet(a, b).lock()
    outputs.write_parquet(pd.DataFrame({"x": [1]}), a, {"run": 1})
    outputs.write_parquet(pd.DataFrame({"x": [1]}), b, {"run": 1})
    monkeypatch.setattr(fs.os, "replace", dies_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        outputs.commit()
    outputs._release()  # the process is gone: its lock with it
    monkeypatch.undo()
    assert a.exists() and not b.exists()  # a mix on disk, with the journal beside it
    with FileSet(a, b):  # the next writer finishes the renames before anything else
        assert b.exists()
        assert cio.read_parquet(a)[1]["output_set"] == cio.read_parquet(b)[1]["output_set"]
    no_leftovers(tmp_path)


def test_a_writer_failure_in_a_staged_figure_names_the_final_path(tmp_path) -> None:
    figure = tmp_path / "fig.png"
    failed = pytest.raises(WriteFailed, match=f"could not write {figure} \\(disk full\\)")
    with failed, FileSet(tmp_path / "o.parquet", figure) as outputs:
        target = outputs.path(figure)
        cio.atomic_write_bytes(target, lambda tmp: (_ for _ in ()).throw(ENOSPC))
    assert not figure.exists()
    no_leftovers(tmp_path)


# -- one writer ------------------------------------------------------------------------------
def test_a_second_writer_in_the_same_process_is_refused(tmp_path) -> None:
    target = tmp_path / "o.parquet"
    busy = pytest.raises(OutputBusy, match=rf"pid {os.getpid()} on {socket.gethostname()}")
    with OutputLock(target), busy:
        OutputLock(target).acquire()
    assert not lock_path(target).exists()  # released: the lock file is gone
    with OutputLock(target):  # and can be taken again
        pass


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path) -> None:
    """A killed run's kernel lock died with it; its lock file (pid, host) stays behind."""
    target = tmp_path / "o.parquet"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lock_path(target).write_text(
        json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()})
    )
    with OutputLock(target) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_without_record_locks_the_lock_is_an_exclusive_file(tmp_path, monkeypatch, code) -> None:
    """Some network file systems refuse lockf: the lock file's exclusive creation stands in;
    a stale one (dead pid, this host) is taken over, a live or foreign one is refused."""

    def no_record_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(lk.fcntl, "lockf", no_record_locks)
    target = tmp_path / "o.parquet"
    with OutputLock(target), pytest.raises(OutputBusy):
        OutputLock(target).acquire()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lock_path(target).write_text(
        json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()})
    )
    with OutputLock(target):
        pass
    lock_path(target).write_text(json.dumps({"pid": 1, "host": "elsewhere.example"}))
    with pytest.raises(OutputBusy, match="pid 1 on elsewhere.example.*delete"):
        OutputLock(target).acquire()


def test_two_probe_runs_writing_the_same_output_at_once(tiny_model_dir, pool_file, tmp_path):
    """Two processes, one -o: the second exits 2 with one line naming the first (pid,
    host) while the first finishes its complete set (today both exit 0)."""
    out = tmp_path / "p.parquet"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "cdscope.cli", "probe", "-m", str(tiny_model_dir), "-p",
               str(pool_file), "--n", "1", "-o", str(out)]  # fmt: skip
    slow = (  # the real CLI in a real process, each seed slowed down so the runs overlap
        "import sys, time; import cdscope.commands.probe as p; m = p.measure_seed; "
        "p.measure_seed = lambda *a, **k: (time.sleep(0.3), m(*a, **k))[1]; "
        "sys.argv = sys.argv[1:]; from cdscope.cli import main; main()"
    )
    first = subprocess.Popen([sys.executable, "-c", slow, *command[2:], "--seeds", "40"],
                             env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not partial_path(out).exists() and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = subprocess.run([*command, "--seeds", "1"], env=env, text=True,
                                capture_output=True, timeout=120)  # fmt: skip
        assert first.poll() is None, "the first run ended before the second started"
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}" in lines[0]
        assert first.wait(timeout=300) == 0, first.communicate()
    finally:
        first.kill()
    assert sorted(set(pd.read_parquet(out)["seed"])) == list(range(40))


# -- a rerun, a full disk --------------------------------------------------------------------
def test_from_onto_a_nearly_full_disk_leaves_the_old_set(tmp_path, monkeypatch) -> None:
    """bshared --from: the summary's write fails (disk full) after OUT was written; all
    three files stay the earlier run's (today OUT is new, the summary old)."""
    source = probe_file(tmp_path / "x.probe.parquet")
    out = tmp_path / "b.parquet"
    assert invoke("bshared", "--from", source, "-o", out, "--bootstrap", 0).exit_code == 0
    before = snapshot(tmp_path)
    real, written = cio.pq.write_table, []

    def fills_up(table, where, **kwargs):
        written.append(where)
        if len(written) == 2:
            Path(where).write_bytes(b"half")
            raise ENOSPC
        real(table, where, **kwargs)

    monkeypatch.setattr(cio.pq, "write_table", fills_up)
    refused(invoke("bshared", "--from", source, "-o", out, "--bootstrap", 10), "disk full")
    assert snapshot(tmp_path) == before
    no_leftovers(tmp_path)


def test_a_rerun_killed_after_its_first_seed_leaves_the_complete_output(
    tiny_model_dir, pool_file, tmp_path, monkeypatch
) -> None:
    """A complete 3-seed bshared, rerun without --resume and interrupted after one seed:
    OUT and its siblings are untouched (today OUT.probe is a 1-seed file); the rerun's
    seed waits in OUT.probe.partial, and --resume finishes from it to a fresh run's
    numbers (bit for bit: same process, same threads)."""
    from cdscope.commands import probe as probe_cmd

    args = ["bshared", "-m", tiny_model_dir, "-p", pool_file, "--seeds", 3, "--bootstrap", 0]
    out = tmp_path / "b.parquet"
    assert invoke(*args, "--n", 1, "-o", out).exit_code == 0
    before = snapshot(tmp_path)
    real, calls = probe_cmd.measure_seed, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C (or kill) during the second seed
        return real(*a, **k)

    monkeypatch.setattr(probe_cmd, "measure_seed", interrupted)
    assert invoke(*args, "--n", 2, "-o", out).exit_code == 130  # another run: n = 2
    monkeypatch.undo()
    after = snapshot(tmp_path)
    progress = tmp_path / "b.probe.partial.parquet"
    assert {k: v for k, v in after.items() if k != progress.name} == before
    assert sorted(set(pd.read_parquet(progress)["seed"])) == [0]
    resumed = invoke(*args, "--n", 2, "-o", out, "--resume")
    assert resumed.exit_code == 0 and "keeping 1 finished" in resumed.output, resumed.output
    assert not progress.exists()
    fresh = tmp_path / "fresh" / "b.parquet"
    assert invoke(*args, "--n", 2, "-o", fresh).exit_code == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(fresh))
    no_leftovers(tmp_path)


def test_refused_run_leaves_no_lock_or_staging(tmp_path) -> None:
    source = probe_file(tmp_path / "one.probe.parquet", families=("math",))
    refused(invoke("bshared", "--from", source, "-o", tmp_path / "a.parquet"), "2 families")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.probe.parquet"]


def test_a_busy_output_is_refused_before_any_work(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    with OutputLock(out):
        line = refused(invoke("probe", "-m", tiny_model_dir, "-p", pool_file, "-o", out),
                       "is being written by another cdscope run")  # fmt: skip
    assert f"pid {os.getpid()}" in line and not out.exists()
