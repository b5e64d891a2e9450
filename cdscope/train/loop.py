"""The training loop: GRPO backbone + optional CD-RFT, one row of log per step (SPEC §5).

One step t (both arms identical except where marked):

1. prompts: ``prompts_per_step`` tasks from a seeded, stateless data order
   (``step_task_indices``: epoch e is the permutation ``default_rng([seed, e])``), so the
   order depends on (seed, t) only — the same for both arms and after ``--resume``;
2. rollouts: ``generation.sample`` with G samples per prompt and seed (seed, t);
3. rewards: ``tasks.verifiers.verify_many``, passed -> 1.0 else 0.0;
4. probe measurement B_shared / R before the step (both arms, logged; carried over from
   the previous step's closing measurement, which is at the same theta);
5. backbone: group advantages, grad of the GRPO loss accumulated over micro-batches;
6. [cdrft] lambda * grad R(C(theta)) on the probe added to the gradient;
7. a diverging step (non-finite loss or gradient) stops the run before the update;
8. AdamW step, cosine LR schedule step;
9. probe measurement after the update; [cdrft] the projection loop while
   B_shared > tau and fewer than K_max iterations (``cdrft.project``);
10. the log row, written atomically to ``OUT/log.parquet``; a checkpoint every
    ``save_every`` steps and at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from torch import nn

from cdscope.batch import ProbeBatch
from cdscope.errors import CdscopeError
from cdscope.gates import GatedModel
from cdscope.generation import sample
from cdscope.io import write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.tasks.format import Task
from cdscope.tasks.verifiers import verify_many
from cdscope.train.cdrft import (
    ProbeMeasure,
    ProjectionResult,
    add_regularizer_grad,
    finite_params,
    measure,
    probe_rows_per_forward,
    project,
)
from cdscope.train.checkpoint import latest_checkpoint_path, load_checkpoint, save_checkpoint
from cdscope.train.config import TrainConfig
from cdscope.train.grpo import backbone_backward, group_advantages

LOG_NAME = "log.parquet"
#: settings that must match the checkpoint for ``--resume`` to continue the same run
RESUME_FIXED = (
    "model", "steps", "prompts_per_step", "group_size", "max_new_tokens", "temperature",
    "top_p", "lr", "warmup_steps", "weight_decay", "max_grad_norm", "clip_eps", "beta",
    "regularizer", "lam", "tau", "k_max", "eta_proj", "eps", "estimator", "probe_n",
    "template", "seed", "tasks", "probe_files", "micro_batch_size", "rollout_batch_size",
    "probe_batch_size", "verify_timeout", "dtype", "attn", "backend",
)  # fmt: skip


def step_task_indices(num_tasks: int, seed: int, step: int, per_step: int) -> list[int]:
    """Task indices of step ``step``: consecutive slices of seeded per-epoch permutations."""
    out = []
    for j in range(per_step):
        i = step * per_step + j
        epoch, pos = divmod(i, num_tasks)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(num_tasks)[pos]))
    return out


def rollout_seed(seed: int, step: int) -> int:
    return int(np.random.default_rng([seed, step, 17]).integers(2**31 - 1))


def cosine_schedule(
    optimizer: torch.optim.Optimizer, steps: int, warmup: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup`` steps, then cosine decay to 0 at ``steps``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class TrainResult:
    out_dir: Path
    log: pd.DataFrame
    steps_done: int
    resumed_from: int | None
    final_dir: Path | None


@dataclass
class TrainInputs:
    """Everything a run needs, prepared and validated by ``commands.train``."""

    cfg: TrainConfig
    model: nn.Module
    tokenizer: Any
    tasks: Sequence[Task]
    families: list[str]  # training families, sorted (reward columns)
    probe: ProbeBatch
    metadata: dict[str, Any]
    ref_model: nn.Module | None = None
    #: (tasks, completions) -> rewards; default: the shared verifiers (passed -> 1.0)
    reward_fn: Callable[[Sequence[Task], Sequence[str]], list[float]] | None = None


def verifier_rewards(
    tasks: Sequence[Task], completions: Sequence[str], timeout: float = 5.0, workers: int = 2
) -> list[float]:
    """1.0 for every completion its task's verifier passes, else 0.0 (code: sandboxed)."""
    verdicts = verify_many(tasks, completions, timeout=timeout, workers=workers)
    return [1.0 if v.passed else 0.0 for v in verdicts]


def _diverged(step: int, what: str, out_dir: Path) -> CdscopeError:
    kept = latest_checkpoint_path(out_dir)
    where = f"the last good checkpoint is {kept}" if kept else "no checkpoint was written yet"
    return CdscopeError(
        f"training diverged at step {step}: {what} is not finite (NaN/inf); stopped before "
        f"applying it; {where}; lower --lr (or --lambda / --eta-proj) and rerun"
    )


def _reward_row(tasks: Sequence[Task], rewards: torch.Tensor, families: list[str]) -> dict:
    row: dict[str, float] = {"reward": float(rewards.mean())}
    for family in families:
        picked = [float(r) for t, r in zip(tasks, rewards, strict=True) if t.family == family]
        row[f"reward_{family}"] = float(np.mean(picked)) if picked else float("nan")
    return row


def train(
    inputs: TrainInputs,
    resume: bool = False,
    console: Console | None = None,
    stop_after: int | None = None,
    save_final: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> TrainResult:
    """Run (or continue, with ``resume``) the training loop of ``inputs.cfg``.

    ``stop_after`` ends the call after that many steps of this invocation (a time-boxed
    job; ``--resume`` continues it exactly). The final model is saved as a Hugging Face
    directory ``OUT/final`` when the last step is done.
    """
    cfg, model = inputs.cfg, inputs.model
    console = console or make_console()
    out_dir = Path(cfg.out_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = cosine_schedule(optimizer, cfg.steps, cfg.warmup_steps)
    start_step, log_rows, resumed_from = 0, [], None
    if resume:
        checkpoint = load_checkpoint(out_dir, model, optimizer, scheduler)
        saved = TrainConfig.from_dict(checkpoint.config)
        changed = [k for k in RESUME_FIXED if getattr(saved, k) != getattr(cfg, k)]
        if changed:
            raise CdscopeError(
                f"--resume: settings differ from the checkpointed run ({', '.join(changed)}); "
                "resume with the same settings or start a new --out-dir"
            )
        start_step, log_rows, resumed_from = checkpoint.step, checkpoint.log_rows, checkpoint.step
    elif latest_checkpoint_path(out_dir) is not None:
        raise CdscopeError(
            f"{out_dir} already holds a training run; pass --resume to continue it "
            "or choose another --out-dir"
        )
    end_step = cfg.steps if stop_after is None else min(cfg.steps, start_step + stop_after)
    cdrft = cfg.regularizer == "cdrft"
    probe_bs = probe_rows_per_forward(cfg.probe_batch_size, model)
    # C on the probe after step t is C before step t+1 (rollouts do not move theta), so
    # each step's closing measurement is carried over instead of being recomputed.
    carried: ProbeMeasure | None = None
    with GatedModel(model) as gm, progress_bar(console, "live") as progress:
        bar = progress.add_task(
            f"train {cfg.regularizer}", total=cfg.steps, completed=start_step, live=""
        )
        for step in range(start_step, end_step):

            def status(phase: str, step: int = step) -> None:
                progress.update(
                    bar, description=f"train {cfg.regularizer} step {step + 1}: {phase}"
                )

            row, carried = _one_step(
                inputs, gm, params, optimizer, scheduler, step, cdrft, probe_bs, carried, status
            )
            log_rows.append(row)
            write_parquet(pd.DataFrame(log_rows), out_dir / LOG_NAME, inputs.metadata)
            done = step + 1
            if done % cfg.save_every == 0 or done == cfg.steps or done == end_step:
                save_checkpoint(out_dir, done, model, optimizer, scheduler, cfg.to_dict(), log_rows)
            live = (
                f"reward {row['reward']:.2f}  B_shared {100 * row['b_shared_before']:.1f}"
                f"->{100 * row['b_shared_after']:.1f}%  proj {row['proj_iters']}"
            )
            progress.update(bar, advance=1, live=live, description=f"train {cfg.regularizer}")
            if on_step is not None:
                on_step(row)
    final_dir = None
    if save_final and end_step == cfg.steps:
        final_dir = save_final_model(model, inputs.tokenizer, out_dir / "final")
    return TrainResult(out_dir, pd.DataFrame(log_rows), end_step, resumed_from, final_dir)


def _one_step(
    inputs: TrainInputs,
    gm: GatedModel,
    params: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    step: int,
    cdrft: bool,
    probe_bs: int | None,
    before: ProbeMeasure | None = None,
    status: Callable[[str], None] = lambda phase: None,
) -> tuple[dict[str, Any], ProbeMeasure]:
    """One optimizer step; ``before`` is the probe measurement at the current theta when
    the previous step already made it. Returns the log row and the closing measurement."""
    cfg, model, probe = inputs.cfg, inputs.model, inputs.probe
    out_dir = Path(cfg.out_dir)
    began = time.perf_counter()
    status("rollouts")
    chosen = [
        inputs.tasks[i]
        for i in step_task_indices(len(inputs.tasks), cfg.seed, step, cfg.prompts_per_step)
    ]
    rollouts = sample(
        model,
        inputs.tokenizer,
        [t.prompt for t in chosen],
        num_samples=cfg.group_size,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=rollout_seed(cfg.seed, step),
        batch_size=cfg.rollout_batch_size,
        top_p=cfg.top_p,
    )
    expected = torch.arange(len(chosen)).repeat_interleave(cfg.group_size)
    if not torch.equal(rollouts.prompt_index, expected):  # groups must be consecutive rows
        raise RuntimeError("generation.sample returned rows that are not grouped by prompt")
    answered = [chosen[int(i)] for i in rollouts.prompt_index]
    if inputs.reward_fn is not None:
        scores = inputs.reward_fn(answered, rollouts.texts)
    else:
        scores = verifier_rewards(answered, rollouts.texts, cfg.verify_timeout, cfg.verify_workers)
    rewards = torch.tensor(scores, dtype=torch.float32)
    rollout_s = time.perf_counter() - began

    t = time.perf_counter()
    if before is None:
        status("probe")
        before = measure(gm, probe, probe_bs)
    measure_s = time.perf_counter() - t

    status("backbone")
    t = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    stats = backbone_backward(
        model,
        rollouts.prompt_ids,
        rollouts.prompt_mask,
        rollouts.completion_ids,
        rollouts.completion_mask,
        group_advantages(rewards, cfg.group_size),
        clip_eps=cfg.clip_eps,
        beta=cfg.beta,
        ref_model=inputs.ref_model,
        micro_batch_size=cfg.micro_batch_size,
    )
    backbone_s = time.perf_counter() - t
    if not math.isfinite(stats.loss):
        raise _diverged(step + 1, "the GRPO loss", out_dir)

    # clipping (off by default) acts on the backbone gradient only, as in the TRL route
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf")))
    regularizer_s, reg_R = 0.0, float("nan")  # noqa: N806
    if cdrft and cfg.lam > 0:
        status("regulariser")
        t = time.perf_counter()
        reg = add_regularizer_grad(
            gm, probe, params, cfg.lam, cfg.estimator, cfg.eps, probe_bs, at=before
        )
        regularizer_s, reg_R = time.perf_counter() - t, reg.R  # noqa: N806
    if not finite_params(params):
        raise _diverged(step + 1, "the gradient", out_dir)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()

    t = time.perf_counter()
    after_update = measure(gm, probe, probe_bs)
    measure_s += time.perf_counter() - t
    if cdrft:
        status("projection")
        proj = project(
            gm, probe, params, cfg.tau, cfg.k_max, cfg.eta_proj, cfg.estimator, cfg.eps,
            probe_bs, start=after_update,
        )  # fmt: skip
    else:
        proj = ProjectionResult(0, after_update, after_update, 0.0)
    if not finite_params(params):
        raise _diverged(step + 1, "a parameter after the update", out_dir)
    row = {
        "step": step + 1,
        **_reward_row(answered, rewards, inputs.families),
        "loss": stats.loss,
        "kl": stats.kl,
        "grad_norm_backbone": grad_norm,
        "lr": lr,
        "completion_tokens": stats.tokens,
        "b_shared_before": before.b_shared,
        "r_before": before.R,
        "b_shared_after_update": after_update.b_shared,
        "b_shared_after": proj.after.b_shared,
        "r_after": proj.after.R,
        "r_regularizer": reg_R,
        "proj_iters": proj.iterations,
        "rollout_s": rollout_s,
        "backbone_s": backbone_s,
        "measure_s": measure_s,
        "regularizer_s": regularizer_s,
        "projection_s": proj.seconds,
        "step_s": time.perf_counter() - began,
    }
    return row, proj.after


def save_final_model(model: nn.Module, tokenizer: Any, target: Path) -> Path:
    """``save_pretrained`` model + tokenizer into a temp folder, then rename to ``target``."""
    import shutil
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CdscopeError(f"could not save the final model to {target}: {exc}") from exc
    return target
