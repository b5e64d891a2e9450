"""Data-parallel audits under a launcher: 2 CPU ranks (gloo) against a single process.

Every multi-process run is bounded in time. ``torchrun`` is used where the launcher's own
behaviour matters (equality, a rank killed mid-run); where the test needs each rank's
exit code and stderr, the ranks are started the way torchrun starts them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) so each process can be inspected.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.distributed import Launch, share
from cdscope.fileset import partial_path
from tests.helpers import byte_tokenizer, tiny_model

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 240
K, M = 6, 3  # tiny models: 3 layers x (attn, mlp); the pool has 3 families


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CDSCOPE_DIST_TIMEOUT_S="120")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], nproc: int = 2, **popen) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node N -m cdscope.cli -- ARGS`` (``--`` keeps
    torchrun's own parser away from cdscope options such as ``--n``)."""
    cmd = [str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}", "-m", "cdscope.cli", "--"]
    return subprocess.Popen(cmd + [str(a) for a in args], env=_env(), cwd=ROOT, text=True, **popen)


def ranks(args: list[str], world: int = 2) -> list[tuple[int, str, str]]:
    """Start ``world`` ranks as torchrun would; (exit code, stdout, stderr) per rank."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = _env() | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "cdscope.cli", *map(str, args)],
                env=env,
                cwd=ROOT,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        outputs = [p.communicate(timeout=TIMEOUT) for p in procs]
        return [(p.returncode, *o) for p, o in zip(procs, outputs, strict=True)]
    finally:
        for p in procs:
            p.kill()


def single(*args: object) -> None:
    """The same command in this process at one thread, as each rank runs (``_env``): the
    thread count moves fp32 sums (C by ~1e-5 relative, docs/resume.md), and the suite's
    thread count depends on which tests ran before (the test order once hid this)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output


def metadata(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[b"cdscope"])


@pytest.fixture(scope="module")
def second_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-gpt2")
    tiny_model("gpt2", seed=1).save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["model", "seed", "family", "gate"]).reset_index(drop=True)


def test_share_is_round_robin_and_covers_the_work_once() -> None:
    work = [(m, s) for m in "ab" for s in range(3)]
    parts = [share(work, Launch(r, 4)) for r in range(4)]
    assert parts[0] == [("a", 0), ("b", 1)] and parts[3] == [("b", 0)]
    assert sorted(p for part in parts for p in part) == sorted(work)


def test_two_ranks_write_the_single_process_audit(
    tiny_model_dir, second_model_dir, pool_file, tmp_path
) -> None:
    models = ["--model", tiny_model_dir, "--model", second_model_dir]
    common = ["--probe", pool_file, "--seeds", 3, "--n", 2, "--device", "cpu"]
    proc = torchrun(["bshared", *models, *common, "--out", tmp_path / "dp.parquet"])
    assert proc.wait(timeout=TIMEOUT) == 0
    single("bshared", *models, *common, "--out", tmp_path / "sp.parquet")
    for suffix in ("probe.parquet", "parquet", "summary.parquet"):
        dp = pd.read_parquet(tmp_path / f"dp.{suffix}")
        sp = pd.read_parquet(tmp_path / f"sp.{suffix}")
        # same rows in the same order; values equal to fp32 round-off (bit-equal when the
        # single run also uses one thread, as the ranks do)
        pd.testing.assert_frame_equal(dp, sp, check_exact=False, rtol=1e-6, atol=1e-9)
    assert len(pd.read_parquet(tmp_path / "dp.probe.parquet")) == 2 * 3 * M * K
    meta = metadata(tmp_path / "dp.probe.parquet")
    assert meta["world_size"] == 2 and metadata(tmp_path / "sp.probe.parquet")["world_size"] == 1
    assert [m["name"] for m in meta["models"]] == [str(tiny_model_dir), str(second_model_dir)]


def test_resume_across_world_sizes(tiny_model_dir, pool_file, tmp_path) -> None:
    common = ["probe", "--model", tiny_model_dir, "--probe", pool_file, "--device", "cpu"]
    out = tmp_path / "p.parquet"
    single(*common, "--seeds", 1, "--out", out)  # world size 1 measures seed 0
    proc = torchrun([*common, "--seeds", 3, "--out", out, "--resume"])  # 2 ranks: seeds 1, 2
    assert proc.wait(timeout=TIMEOUT) == 0
    single(*common, "--seeds", 3, "--out", tmp_path / "ref.parquet")
    pd.testing.assert_frame_equal(
        _sorted(pd.read_parquet(out)),
        _sorted(pd.read_parquet(tmp_path / "ref.parquet")),
        check_exact=False,
        rtol=1e-6,
        atol=1e-9,
    )
    assert metadata(out)["world_size"] == 2


def test_failing_rank_fails_every_rank_with_one_line(tiny_model_dir, pool_file, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\0" * 64)  # rank 1 draws this model
    out = tmp_path / "p.parquet"
    results = ranks(
        ["probe", "-m", tiny_model_dir, "-m", broken, "--probe", pool_file, "--out", out]
        + ["--device", "cpu"]
    )
    assert [rc for rc, _, _ in results] == [2, 2]
    lines = results[0][2].strip().splitlines()  # progress lines, then the one error line
    assert [line for line in lines if "error" in line] == lines[-1:], results[0][2]
    assert lines[-1].startswith("error: rank 1: ") and str(broken) in lines[-1]
    assert results[1][2].strip() == "" and results[1][1].strip() == ""
    assert not out.exists()  # the output set is incomplete: OUT is not written
    kept = pd.read_parquet(partial_path(out))  # rank 0's finished pair, kept for --resume
    assert set(kept["model"]) == {str(tiny_model_dir)} and len(kept) == M * K


def test_world_size_larger_than_the_work_is_refused(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    results = ranks(["probe", "-m", tiny_model_dir, "--probe", pool_file, "--out", out])
    assert [rc for rc, _, _ in results] == [2, 2]
    assert results[0][2].strip().count("\n") == 0
    assert "launched with 2 ranks but only 1 (model, seed) pair" in results[0][2]
    assert results[1][2] == "" and not out.exists()


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` under the torchrun process ``launcher``."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(child)
    return None


def test_killed_rank_leaves_the_last_complete_parquet(tiny_model_dir, pool_file, tmp_path) -> None:
    common = ["probe", "-m", tiny_model_dir, "--probe", pool_file, "--device", "cpu"]
    out = tmp_path / "p.parquet"
    progress = partial_path(out)
    proc = torchrun(
        [*common, "--seeds", 40, "--out", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not progress.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert progress.exists(), "no Parquet written before the deadline"
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) != 0
    finally:
        proc.kill()
    assert not out.exists()  # the run never completed its output set
    kept = pd.read_parquet(progress)  # a whole file: rows of complete rounds only
    seeds = sorted(set(kept["seed"]))
    assert 2 <= len(seeds) < 40 and seeds == list(range(len(seeds)))
    assert len(kept) == len(seeds) * M * K
    single(*common, "--seeds", len(seeds) + 2, "--out", out, "--resume")
    single(*common, "--seeds", len(seeds) + 2, "--out", tmp_path / "ref.parquet")
    pd.testing.assert_frame_equal(
        pd.read_parquet(out),
        pd.read_parquet(tmp_path / "ref.parquet"),
        check_exact=False,
        rtol=1e-6,
        atol=1e-9,
    )


def test_single_process_commands_refuse_a_launcher(
    tiny_model_dir, pool_file, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    out = tmp_path / "g.parquet"
    args = ["gradcheck", "-m", tiny_model_dir, "--probe", pool_file, "--out", out]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "WORLD_SIZE=2" in result.output
    assert not out.exists()


def test_launch_ends_a_failed_run_with_one_line_and_the_ranks_exit_code(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    """``python -m cdscope.launch`` is torchrun without its failure trace: a rank failing on
    a corrupt model gives rank 0's one line and exit 2, where torchrun prints ~40 lines
    and exits 1 (both checked, so the difference is pinned)."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\0" * 64)  # rank 1 draws this model
    args = ["probe", "-m", tiny_model_dir, "-m", broken, "--probe", pool_file, "--device", "cpu"]
    launch = [sys.executable, "-m", "cdscope.launch", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*launch, "-m", "cdscope.cli", "--", *map(str, args), "--out", str(tmp_path / "a.parquet")],
        env=_env(), cwd=ROOT, text=True, capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], done.stderr
    assert lines[-1].startswith("error: rank 1: ") and str(broken) in lines[-1], done.stderr
    plain = torchrun([*args, "--out", tmp_path / "b.parquet"], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)  # fmt: skip
    _, err = plain.communicate(timeout=TIMEOUT)
    assert plain.returncode == 1 and "ChildFailedError" in err and len(err.splitlines()) > 20


def test_failure_lines_name_every_rank_that_could_not_speak() -> None:
    from cdscope.launch import failure_lines

    class Failure:
        def __init__(self, exitcode: int, pid: int) -> None:
            self.exitcode, self.pid = exitcode, pid

        def signal_name(self) -> str:
            return signal.Signals(-self.exitcode).name

    # rank 0 spoke (exit 2): its line covers rank 1's shared failure
    assert failure_lines({0: Failure(2, 10), 1: Failure(2, 11)}) == ([], 2)
    # ... and a rank stopped by the launcher because rank 0 exited first (seen under load)
    assert failure_lines({0: Failure(2, 10), 1: Failure(-15, 11)}) == ([], 2)
    # a rank killed otherwise still gets its line
    lines, code = failure_lines({0: Failure(2, 10), 1: Failure(-9, 11)})
    assert code == 2 and lines == [
        "rank 1 (pid 11) was killed by SIGKILL; finished work is kept: rerun with --resume"
    ]
    # rank 1 killed, rank 0 stopped by torchrun: one line each, torchrun's exit code 1
    lines, code = failure_lines({0: Failure(-15, 10), 1: Failure(-9, 11)})
    assert code == 1 and len(lines) == 2
    assert "stopped by the launcher (SIGTERM)" in lines[0] and "killed by SIGKILL" in lines[1]
    # rank 0 died by a signal, rank 1 exited 2 silently: it gets a line, the code is its
    lines, code = failure_lines({0: Failure(-9, 10), 1: Failure(2, 11)})
    assert code == 2 and lines[1] == "rank 1 (pid 11) exited with code 2"
