"""CD-RFT under FSDP2 with activation checkpointing: 2 CPU ranks (torchrun, gloo) against one process.

``tests/train/fsdp_run.py`` runs the hf loop (``run_train``) on a tiny Llama (its head tied
to its embedding, like the embedded SmolLM2) with cdscope's own rollouts and probe, the
deterministic ``parity_reward`` (a non-zero GRPO gradient) and beta > 0 (the frozen
reference model is sharded too). The sharded run stops after
step 1 and is resumed to step 2 from its checkpoint; the one-process run (checkpointing
alone) goes straight through. ``tests/train/fsdp_none_run.py`` injects sharded parameters
whose gradient comes back None. Every launch is bounded in time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file

from tests.helpers import run_launcher
from tests.train.fsdp_run import tied_llama, write_inputs

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 300


def _launch(script: str, nproc: int, *args: object) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CDSCOPE_DIST_TIMEOUT_S="120")
    path = str(ROOT / "tests" / "train" / script)
    cmd = [sys.executable, path] if nproc == 1 else [
        str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}", path,
    ]  # fmt: skip
    done = run_launcher([*cmd, *map(str, args)], TIMEOUT, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]


def _untied(state: dict) -> dict:
    """The tied head and embedding under one name (a file stores one of the two)."""
    state = dict(state)
    if "lm_head.weight" in state:
        state.setdefault("model.embed_tokens.weight", state.pop("lm_head.weight"))
        state.pop("lm_head.weight", None)
    return state


def test_sharded_checkpointed_steps_equal_one_process(tmp_path: Path) -> None:
    common = ("--activation-checkpointing", "--steps", 2, "--beta", 0.04)
    one, two = tmp_path / "one", tmp_path / "two"
    write_inputs(one)
    write_inputs(two)
    _launch("fsdp_run.py", 1, one, *common)
    _launch("fsdp_run.py", 2, two, "--sharding", "fsdp", *common, "--stop-after", 1)
    assert not (two / "run" / "final").exists()
    _launch("fsdp_run.py", 2, two, "--sharding", "fsdp", *common, "--resume")
    start = _untied(tied_llama().state_dict())
    for name in ("checkpoints/step-000001/model.safetensors", "final/model.safetensors"):
        a, b = (_untied(load_file(d / "run" / name)) for d in (one, two))
        assert set(a) == set(b) == set(start)
        update = max(float((a[k] - start[k]).abs().max()) for k in a)
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        print(f"{name}: max |update| {update:.3g}, max |w(2 ranks) - w(1 process)| {diff:.3g}")
        # measured bit for bit (0.0): the same rollouts, the GRPO sum split over ranks and
        # rescaled by powers of 2, the same probe on every rank; the bar is 1 %
        assert update > 1e-4 and diff <= 0.01 * update
    logs = [pd.read_parquet(d / "run" / "log.parquet") for d in (one, two)]
    assert list(logs[1]["step"]) == [1, 2]  # logged once per step, by rank 0
    timing = [c for c in logs[0] if c.endswith("_s")]
    pd.testing.assert_frame_equal(*(log.drop(columns=timing) for log in logs), rtol=1e-6)
    assert logs[1]["kl"].iloc[1] > 0 and logs[1]["proj_iters"].sum() > 0


def test_sharded_exact_gradient_and_parameters_without_gradient(tmp_path: Path) -> None:
    _launch("fsdp_none_run.py", 2, tmp_path)
    outcome = dict(
        line.split(": ", 1) for line in (tmp_path / "outcome.txt").read_text().splitlines()
    )
    # the exact double backward, sharded (parameters kept gathered between its two
    # passes): measured equal to the unsharded one bit for bit
    assert float(outcome.pop("exact")) < 1e-6
    assert set(outcome) == {"blocks-only", "bypass", "step"}
    assert "model.layers.0.self_attn.q_proj.weight" in outcome["blocks-only"]
    assert "unsharded root" in outcome["blocks-only"]
    assert "model.layers.1.mlp.gate_proj.weight" in outcome["bypass"]
    assert "lm_head.weight" in outcome["step"] and "training step" in outcome["step"]
    assert all("no gradient reached" in text for text in outcome.values())
