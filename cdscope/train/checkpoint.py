"""Training checkpoints that are either complete or absent.

Layout under ``OUT/checkpoints/``::

    step-000004/model.safetensors   parameters (shared / tied tensors stored once)
    step-000004/optimizer.safetensors  AdamW state + LR-scheduler state
    step-000004/rng.safetensors     python, numpy and torch (CPU + CUDA) RNG states
    step-000004/state.json          step, config, the per-step log rows so far
    latest                          the name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder next to its final place and
renamed into place only once every file is written; ``latest`` is then replaced
atomically. So an error mid-write (disk full, Ctrl-C) removes the temporary folder and
leaves ``latest`` on the previous complete checkpoint — tested by making the write fail.

Nothing is pickled: optimizer and RNG states are nested dicts / lists / tuples of
tensors, numpy arrays and plain values, stored as safetensors (the tensors and arrays)
with the structure as JSON in the file's metadata (``save_state`` / ``load_state``), so
loading a checkpoint never executes code from it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from cdscope.errors import CdscopeError
from cdscope.io import WriteFailed, atomic_dir, atomic_write_bytes
from cdscope.settings.training import TrainConfig

LATEST = "latest"


@dataclass
class Checkpoint:
    path: Path
    step: int
    config: dict[str, Any]
    log_rows: list[dict[str, Any]]


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _flatten(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able skeleton of ``value``; tensors and numpy arrays move into ``tensors``."""
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(
            value.astype(np.int64) if value.dtype == np.uint32 else value
        )
        return {"__ndarray__": key, "dtype": str(value.dtype)}
    if isinstance(value, dict):
        if not all(isinstance(k, str | int) for k in value):
            raise TypeError(
                f"cannot store dict keys of types {sorted({type(k).__name__ for k in value})}"
            )
        return {"__dict__": [[k, _flatten(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple | list):
        items = [_flatten(v, tensors) for v in value]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.integer | np.floating):
        return value.item()
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


def _unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, list):
        return [_unflatten(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if "__tensor__" in skeleton:
        return tensors[skeleton["__tensor__"]]
    if "__ndarray__" in skeleton:
        return tensors[skeleton["__ndarray__"]].numpy().astype(skeleton["dtype"])
    if "__tuple__" in skeleton:
        return tuple(_unflatten(v, tensors) for v in skeleton["__tuple__"])
    return {k: _unflatten(v, tensors) for k, v in skeleton["__dict__"]}


def save_state(state: Any, path: Path) -> None:
    """``state`` (nested containers of tensors, arrays, plain values) as one safetensors file."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten(state, tensors)
    save_file(tensors, str(path), metadata={"cdscope_state": json.dumps(skeleton)})


def load_state(path: Path) -> Any:
    """The inverse of ``save_state`` (tensors on CPU)."""
    with safe_open(str(path), framework="pt") as handle:
        skeleton = json.loads(handle.metadata()["cdscope_state"])
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    return _unflatten(skeleton, tensors)


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
    states: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
) -> Path:
    """Write checkpoint ``step`` completely, then point ``latest`` at it. Returns its path.

    ``states``: the (model, optimizer) state dicts to store instead of ``model``'s and
    ``optimizer``'s own -- a sharded run's full states, gathered by the caller
    (``train.engine.full_states``; no tensor in them shares storage).
    Any writer error (``OSError``, safetensors' own errors, ...) becomes a ``CdscopeError``
    naming the checkpoint that stays ``latest``; the partial folder is removed (``io.atomic_dir``).
    """
    root = checkpoint_dir(out_dir)
    name = f"step-{step:06d}"
    final = root / name
    try:
        with atomic_dir(final) as tmp:  # any writer error: the temp folder is removed
            if states is None:
                save_model(model, str(tmp / "model.safetensors"))
                optimizer_state = optimizer.state_dict()
            else:
                save_file(states[0], str(tmp / "model.safetensors"))
                optimizer_state = states[1]
            state = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict()}
            save_state(state, tmp / "optimizer.safetensors")
            save_state(rng_state(), tmp / "rng.safetensors")
            record = {"step": step, "config": config, "log": log_rows}
            (tmp / "state.json").write_text(json.dumps(record, default=str))
        atomic_write_bytes(root / LATEST, lambda path: Path(path).write_text(name + "\n"))
    except WriteFailed as exc:
        kept = latest_checkpoint_path(out_dir)
        previous = (
            f"{kept} is still the latest complete checkpoint" if kept else "no checkpoint kept"
        )
        raise CdscopeError(
            f"could not write checkpoint step {step} to {root} ({exc.reason}); {previous}; "
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
    restore: Callable[[dict[str, torch.Tensor], dict[str, Any]], None] | None = None,
) -> Checkpoint:
    """Restore parameters, optimizer, scheduler and RNG states from ``latest``.

    ``restore(model_state, optimizer_state)`` sets the stored states instead of
    ``load_state_dict`` (a sharded run: ``train.engine.load_full_states``)."""
    path = latest_checkpoint_path(out_dir)
    if path is None:
        raise CdscopeError(
            f"--resume: no complete checkpoint in {checkpoint_dir(out_dir)}; "
            "start without --resume (or point --out-dir at the run to continue)"
        )
    try:
        record = json.loads((path / "state.json").read_text())
        state = load_state(path / "optimizer.safetensors")  # moved to the params' device
        if restore is None:
            load_model(model, str(path / "model.safetensors"), strict=True)
            optimizer.load_state_dict(state["optimizer"])  # by load_state_dict itself
        else:
            restore(load_file(str(path / "model.safetensors")), state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(load_state(path / "rng.safetensors"))
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise CdscopeError(f"--resume: checkpoint {path} cannot be loaded: {exc}") from exc
    return Checkpoint(path, int(record["step"]), record["config"], list(record["log"]))


#: settings that must match the checkpoint for ``--resume`` to continue the same run. The
#: model, task and probe files are compared by content, not by the paths in the config
#: (``commands.train.check_resumed_run``): a moved file is the same input, an edited
#: one is not
RESUME_FIXED = (
    "steps", "prompts_per_step", "group_size", "max_new_tokens", "temperature",
    "top_p", "lr", "warmup_steps", "weight_decay", "max_grad_norm", "clip_eps", "beta",
    "regularizer", "lam", "tau", "k_max", "eta_proj", "eps", "estimator", "probe_n",
    "template", "seed", "micro_batch_size", "rollout_batch_size",
    "probe_batch_size", "verify_timeout", "dtype", "attn", "backend", "granularity",
    "sharding", "activation_checkpointing", "probe_split", "probe_max_tokens", "plain_step",
    "eval_every", "eval_n", "eval_k", "eval_limit", "eval_max_new_tokens", "audit_every",
    "audit_seeds", "audit_n", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
    "mask_truncated_completions", "proj_max_norm",
)  # fmt: skip


def check_resumable(checkpoint: Checkpoint, cfg: TrainConfig) -> None:
    """One line naming the ``RESUME_FIXED`` settings in which ``cfg`` differs from the
    checkpointed run's."""
    saved = TrainConfig.from_dict(checkpoint.config)
    changed = [k for k in RESUME_FIXED if getattr(saved, k) != getattr(cfg, k)]
    if changed:
        raise CdscopeError(
            f"--resume: settings differ from the checkpointed run ({', '.join(changed)}); "
            "resume with the same settings or start a new --out-dir"
        )
