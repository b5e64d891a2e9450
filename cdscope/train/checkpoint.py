"""Training checkpoints that are either complete or absent.

Layout under ``OUT/checkpoints/``::

    step-000004/model.safetensors   parameters (shared / tied tensors stored once)
    step-000004/optimizer.pt        AdamW state + LR-scheduler state
    step-000004/rng.pt              python, numpy and torch (CPU + CUDA) RNG states
    step-000004/state.json          step, config, the per-step log rows so far
    latest                          the name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder next to its final place and
renamed into place only once every file is written; ``latest`` is then replaced
atomically. So an error mid-write (disk full, Ctrl-C) removes the temporary folder and
leaves ``latest`` on the previous complete checkpoint — tested by making the write fail.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from cdscope.errors import CdscopeError
from cdscope.io import atomic_write_bytes

LATEST = "latest"


@dataclass
class Checkpoint:
    path: Path
    step: int
    config: dict[str, Any]
    log_rows: list[dict[str, Any]]


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config: dict[str, Any],
    log_rows: list[dict[str, Any]],
) -> Path:
    """Write checkpoint ``step`` completely, then point ``latest`` at it. Returns its path.

    Any ``OSError`` while writing becomes a ``CdscopeError`` naming the checkpoint that
    stays ``latest``; the partial folder is removed.
    """
    root = checkpoint_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save(state, tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        record = {"step": step, "config": config, "log": log_rows}
        (tmp / "state.json").write_text(json.dumps(record, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_bytes(root / LATEST, lambda path: Path(path).write_text(name + "\n"))
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = latest_checkpoint_path(out_dir)
        reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        previous = (
            f"{kept} is still the latest complete checkpoint" if kept else "no checkpoint kept"
        )
        raise CdscopeError(
            f"could not write checkpoint step {step} to {root} ({reason}); {previous}; "
            "free space or choose another --out-dir, then rerun with --resume"
        ) from exc
    return final


def latest_checkpoint_path(out_dir: Path) -> Path | None:
    pointer = checkpoint_dir(out_dir) / LATEST
    if not pointer.is_file():
        return None
    path = checkpoint_dir(out_dir) / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(
    out_dir: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> Checkpoint:
    """Restore parameters, optimizer, scheduler and RNG states from ``latest``."""
    path = latest_checkpoint_path(out_dir)
    if path is None:
        raise CdscopeError(
            f"--resume: no complete checkpoint in {checkpoint_dir(out_dir)}; "
            "start without --resume (or point --out-dir at the run to continue)"
        )
    try:
        record = json.loads((path / "state.json").read_text())
        load_model(model, str(path / "model.safetensors"), strict=True)
        device = next(model.parameters()).device
        state = torch.load(path / "optimizer.pt", map_location=device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CdscopeError(f"--resume: checkpoint {path} cannot be loaded: {exc}") from exc
    return Checkpoint(path, int(record["step"]), record["config"], list(record["log"]))
