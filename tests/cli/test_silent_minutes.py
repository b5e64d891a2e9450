"""No silent minutes (issue #40, item 4): piped to a file, a run says what it is doing as
each phase starts -- a training step's rollouts, rewards, backward, probe measurements,
regulariser and projection; an audit's loading, proof and seeds -- and every input that
can be checked cheaply (model paths, hub-id spelling, input files) is refused before the
command imports torch or transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_startup import PROBE
from tests.helpers import invoke, write_pool, write_tasks_file

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("rollouts", "rewards", "backbone", "probe", "regulariser", "probe after the update",
          "projection")  # fmt: skip


def phase_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.endswith(" elapsed)")]


def test_a_piped_training_run_names_every_phase_of_every_step(tiny_model_dir, tmp_path) -> None:
    """The CLI's stderr under CliRunner is no terminal, as in ``cdscope train 2> log``."""
    tasks = write_tasks_file(tmp_path / "tasks.jsonl")
    pool = write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4})
    result = invoke(
        "train", "-m", tiny_model_dir, "--tasks", tasks, "--probe", pool, "-o", tmp_path / "run",
        "--steps", 2, "--prompts-per-step", 2, "--group-size", 2, "--max-new-tokens", 4,
        "--regularizer", "cdrft", "--tau", 34, "--k-max", 1, "--estimator", "proxy",
        "--probe-n", 1,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = phase_lines(result.output)
    named = [line.split(": ", 1)[1].split(" ... ")[0] for line in lines]
    # step 2's opening measurement is step 1's closing one, carried over (not measured again)
    assert named == [*PHASES, *(p for p in PHASES if p != "probe")], lines
    assert lines[0].startswith("train cdrft step 1: rollouts ... (0:00:")
    assert f"loading {tiny_model_dir} ..." in result.output  # before the first step


def test_a_piped_audit_names_loading_proof_and_each_seed(tiny_model_dir, pool_file, tmp_path):
    result = invoke("bshared", "-m", tiny_model_dir, "-p", pool_file, "--n", 2, "--seeds", 2,
                    "--bootstrap", 0, "-o", tmp_path / "b.parquet")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [line.split(" ... ")[0] for line in phase_lines(result.output)] == [
        f"loading {tiny_model_dir}",
        f"{tiny_model_dir}: finding and proving its residual writes",
        f"{tiny_model_dir} seed 0",
        f"{tiny_model_dir} seed 1",
    ]


# -- cheap checks before the heavy imports --------------------------------------------------------
def run_cli(args: list[str], cwd: Path, **env: str) -> dict:
    """``cdscope ARGS`` in a fresh interpreter: exit code, stdout and whether torch or
    transformers were imported (``test_startup``'s probe)."""
    environment = {**__import__("os").environ, "PYTHONPATH": str(ROOT), **env}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(["torch", "transformers"])],
        capture_output=True, text=True, timeout=120, check=True, cwd=cwd, env=environment,
    )  # fmt: skip
    found = json.loads(run.stdout.splitlines()[-1])
    found["stderr"] = run.stderr
    return found


@pytest.fixture
def workdir(tiny_model_dir, tmp_path) -> Path:
    """A folder as a user's: runs/base is a model, runs/notes is not."""
    shutil.copytree(tiny_model_dir, tmp_path / "runs" / "base")
    (tmp_path / "runs" / "notes").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["bshared", "-m", "./runs/bsae"], "model path not found: ./runs/bsae; did you mean './runs/base'?"),
        (["probe", "-m", "runs/bsae"], "model path not found: runs/bsae; did you mean 'runs/base'?"),
        (["eval", "-m", "runs/base", "-m", "runs/bas"], "did you mean 'runs/base'?"),
        (["train", "-m", "runs/base/../bsae"], "model path not found"),
        (["inspect", "-m", "runs/notes"], "runs/notes is a directory but has no config.json"),
        (["random-ref", "-m", "weights.bin"], "weights.bin is a file but not a .gguf file"),
        (["eap-info", "--baseline", "missing.gguf"], "GGUF file not found: missing.gguf"),
        (["gradcheck", "-m", "my model"], "'my model' is neither a local path nor a hub id"),
        (["nsweep", "-m", "org/name--x"], "is neither a local path nor a hub id"),
        (["probe", "-p", "missing.jsonl"], "probe file not found: missing.jsonl"),
        (["eval", "--tasks", "gsm8k.parquet?schema=gsm8k"], "task file not found: gsm8k.parquet?schema=gsm8k"),
        (["train", "--tasks", "missing.jsonl"], "task file not found: missing.jsonl"),
        (["bshared", "--from", "missing.parquet"], "file not found: missing.parquet"),
        (["eval", "--hard", "ids.txt"], "--hard file not found: ids.txt"),
    ],
)  # fmt: skip
def test_what_can_be_checked_cheaply_is_refused_before_torch_loads(workdir, args, said) -> None:
    out = {"inspect": [], "eval": ["-o", "ev"]}.get(args[0], ["-o", "out.parquet"])
    found = run_cli([*args, *out], workdir)
    assert found["code"] == 2, found
    assert said in found["stderr"] and found["stderr"].count("error:") == 1, found["stderr"]
    assert found["heavy"] == [], f"{args} imported {found['heavy']} before refusing"
    assert sorted(p.name for p in workdir.iterdir()) == ["runs", "weights.bin"]


def test_a_hub_id_the_hub_cannot_be_asked_for_is_refused_before_torch_loads(workdir) -> None:
    """Offline (or with the hub unreachable) and not in the hub cache: nothing can load it.
    A hub id on a reachable hub is left to the load (whether the hub has it costs a request)."""
    found = run_cli(["probe", "-m", "org/model", "-o", "o.parquet"], workdir, HF_HUB_OFFLINE="1",
                    HF_HUB_CACHE=str(workdir / "hub"))  # fmt: skip
    assert found["code"] == 2 and found["heavy"] == [], found
    assert "no copy in the hub cache" in found["stderr"] and "offline mode is on" in found["stderr"]
    found = run_cli(["probe", "-m", "runs/bsae", "-o", "o.parquet"], workdir, HF_HUB_OFFLINE="1")
    assert "did you mean 'runs/base'?" in found["stderr"] and found["heavy"] == []


def test_the_check_does_not_refuse_what_loads(workdir) -> None:
    """The real model (by its path, with a trailing slash, and as a task source with a
    mapping suffix) passes the early check and is measured."""
    found = run_cli(["probe", "-m", "runs/base/", "-p", str(write_pool(workdir / "p.jsonl",
                    {"a": 2, "b": 2})), "--n", "1", "-o", "o.parquet"], workdir)  # fmt: skip
    assert found["code"] in (0, None), found["stderr"]
    assert (workdir / "o.parquet").is_file()
