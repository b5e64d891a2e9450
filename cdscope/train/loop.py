"""The hf training loop: GRPO backbone + optional CD-RFT, one row of log per step (SPEC §5).

One step t (both arms identical except where marked):

1. prompts: ``prompts_per_step`` tasks from a seeded, stateless data order
   (``step_task_indices``: epoch e is the permutation ``default_rng([seed, e])``), so the
   order depends on (seed, t) only — the same for both arms and after ``--resume``;
2. rollouts: ``generation.sample`` with G samples per prompt and seed (seed, t), each
   prompt prefilled once for its G rows where that is exact (``--plain-step``: per row);
3. rewards: ``train.run.score`` (the verifiers: passed -> 1.0 else 0.0);
4. backbone: group advantages, grad of the GRPO loss accumulated over micro-batches
   (``grpo.backbone_backward``: the lean step, or with ``--plain-step`` its slow twin); a
   non-finite loss stops the run;
5. ``CDRFTStep.before_update``: the probe measurement B_shared / R at theta (both arms,
   logged; carried over from the previous step's closing measurement), [cdrft]
   lambda * grad R(C(theta)) added to the gradient, a non-finite gradient stops the run
   before the update;
6. AdamW step, cosine LR schedule step;
7. ``CDRFTStep.after_update``: the probe measurement after the update; [cdrft] the
   projection loop while B_shared > tau and fewer than K_max iterations;
8. the log row (``CDRFTStep.log_fields`` + the backbone's columns), written atomically
   to ``OUT/log.parquet`` and sent to the ``--report-to`` tracker (``train.tracking``); a
   checkpoint every ``save_every`` steps and at the end.

Held-out evidence (``train.evidence``: ``--eval-every``, ``--audit-every``) is taken at
the top of a step, at the weights its ``b_shared_before`` is measured at, when due, and
after the last step; the tracker gets it at x = the steps done.

Steps 5 and 7 are the same object the TRL backend's callback drives
(``integrations.trl``); ``tests/train/test_cdrft_parity.py`` checks both take the same step.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.console import Console

from cdscope.core.gating.model import GatedModel
from cdscope.core.generation import sample
from cdscope.errors import CdscopeError
from cdscope.io import write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.train.checkpoint import (
    check_resumable,
    latest_checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from cdscope.train.completions import CompletionLog
from cdscope.train.engine import (
    Shards,
    checkpoint_blocks,
    full_states,
    gathered,
    load_full_states,
    shard,
    shards_of,
    whole,
)
from cdscope.train.evidence import Evidence
from cdscope.train.grpo import backbone_backward, group_advantages, token_weights
from cdscope.train.run import LOG_NAME, TrainInputs, TrainResult, save_final_model, score
from cdscope.train.step import CDRFTStep
from cdscope.train.tracking import tracking


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


def train_hf(
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
    engines(inputs)  # --activation-checkpointing, --sharding fsdp: before the optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    shards = shards_of(params)
    if cfg.num_completions % shards.world:
        raise CdscopeError(
            f"--sharding fsdp splits the step's {cfg.num_completions} completions (prompts x "
            f"group size) over {shards.world} ranks, which does not divide them; choose "
            "--prompts-per-step so that it does"
        )
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = cosine_schedule(optimizer, cfg.steps, cfg.warmup_steps)
    start_step, log_rows, resumed_from = 0, [], None
    if resume:
        restore = functools.partial(load_full_states, model, optimizer) if shards.sharded else None
        checkpoint = load_checkpoint(out_dir, model, optimizer, scheduler, restore)
        check_resumable(checkpoint, cfg)
        start_step, log_rows, resumed_from = checkpoint.step, checkpoint.log_rows, checkpoint.step
    elif latest_checkpoint_path(out_dir) is not None:
        raise CdscopeError(
            f"{out_dir} already holds a training run; pass --resume to continue it "
            "or choose another --out-dir"
        )
    end_step = cfg.steps if stop_after is None else min(cfg.steps, start_step + stop_after)
    main = shards.rank == 0  # only rank 0 writes the log, the tracker and the checkpoints
    with (
        GatedModel(model, granularity=cfg.granularity) as gm,
        progress_bar(console, "live") as progress,
        tracking(cfg, start_step) if main else contextlib.nullcontext(_no_tracker) as track,
    ):
        cd = CDRFTStep(cfg, gm, inputs.probe, params, lambda: latest_checkpoint_path(out_dir))
        evidence = Evidence(
            cfg, inputs.evidence, gm, inputs.tokenizer, inputs.metadata, cd.rows,
            kept_until=start_step if resume else None, write=main,
        )  # fmt: skip
        completions = (
            CompletionLog(out_dir, inputs.metadata, start_step if resume else None, main)
            if cfg.log_completions
            else None
        )
        bar = progress.add_task(
            f"train {cfg.regularizer}", total=cfg.steps, completed=start_step, live=""
        )
        for step in range(start_step, end_step):

            def status(phase: str, step: int = step) -> None:  # a line per phase in a log
                progress.phase(bar, f"train {cfg.regularizer} step {step + 1}: {phase}")

            _evidence(evidence, step, status, track)
            audit_b_shared = evidence.audit_b_shared(step)  # at b_shared_before's weights
            row = _one_step(
                inputs, cd, optimizer, scheduler, step, status, shards, audit_b_shared,
                completions,
            )  # fmt: skip
            log_rows.append(row)
            if main:
                write_parquet(pd.DataFrame(log_rows), out_dir / LOG_NAME, inputs.metadata)
            track(row)
            done = step + 1
            if done % cfg.save_every == 0 or done == cfg.steps or done == end_step:
                states = full_states(model, optimizer) if shards.sharded else None  # collective
                if main:
                    save_checkpoint(
                        out_dir, done, model, optimizer, scheduler, cfg.to_dict(), log_rows,
                        states,
                    )  # fmt: skip
            live = (
                f"reward {row['reward']:.2f}  B_shared {100 * row['b_shared_before']:.1f}"
                f"->{100 * row['b_shared_after']:.1f}%  proj {row['proj_iters']}"
            )
            progress.update(bar, advance=1, live=live, description=f"train {cfg.regularizer}")
            if on_step is not None:
                on_step(row)
        if end_step == cfg.steps:

            def status_after(phase: str) -> None:
                progress.phase(bar, f"train {cfg.regularizer} after step {end_step}: {phase}")

            _evidence(evidence, end_step, status_after, track)
    final_dir = None
    if save_final and end_step == cfg.steps:
        record = inputs.training_probe_record()
        final_dir = save_final_model(model, inputs.tokenizer, out_dir / "final", record)
    frames = evidence.frames()
    return TrainResult(out_dir, pd.DataFrame(log_rows), end_step, resumed_from, final_dir, **frames)


def _evidence(
    evidence: Evidence, step: int, status: Callable[[str], None], track: Callable[[dict], None]
) -> None:
    """The held-out evidence due at the state after ``step`` steps, sent to the tracker at
    x = ``step``."""
    fields = evidence.measure(step, status)
    if fields:
        track({"step": step, **fields})


def engines(inputs: TrainInputs) -> None:
    """Apply ``--activation-checkpointing`` and ``--sharding fsdp`` to the run's models
    (``train.engine``), in that order (checkpointing wraps each block's forward, then FSDP2
    shards the blocks; the frozen reference model is sharded too, it is only run forward)."""
    cfg = inputs.cfg
    if cfg.activation_checkpointing:
        checkpoint_blocks(inputs.model)
    if cfg.sharding == "fsdp":
        others = (inputs.ref_model,) if inputs.ref_model is not None else ()
        shard(inputs.model, *others)


def _no_tracker(row: dict[str, Any]) -> None:
    """The tracker of a rank that is not rank 0: sends nothing."""


def _one_step(
    inputs: TrainInputs,
    cd: CDRFTStep,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    step: int,
    status: Callable[[str], None],
    shards: Shards,
    audit_b_shared: float = math.nan,
    completions: CompletionLog | None = None,
) -> dict[str, Any]:
    """One optimizer step (0-based ``step``): rollouts, rewards, the GRPO backward, then
    the CD-RFT step around AdamW (``cd``). Returns the step's log row.

    Sharded (``shards``): every rank rolls out and rewards the whole batch (the same
    samples: one seed, the gathered model), backpropagates its 1/W of the completions
    scaled by W (FSDP averages over ranks), and logs the loss / KL summed over ranks."""
    cfg, model = inputs.cfg, inputs.model
    began = time.perf_counter()
    status("rollouts")
    chosen = [
        inputs.tasks[i]
        for i in step_task_indices(len(inputs.tasks), cfg.seed, step, cfg.prompts_per_step)
    ]
    with gathered(model):  # sharded: all-gathered once for the whole generation
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
            share_prefill=not cfg.plain_step,
        )
    expected = torch.arange(len(chosen)).repeat_interleave(cfg.group_size)
    if not torch.equal(rollouts.prompt_index, expected):  # groups must be consecutive rows
        raise RuntimeError("generation.sample returned rows that are not grouped by prompt")
    answered = [chosen[int(i)] for i in rollouts.prompt_index]
    status("rewards")
    scores, reward_columns = score(inputs, answered, rollouts.texts)
    rollout_s = time.perf_counter() - began

    status("backbone")
    t = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    mask = rollouts.completion_mask
    if cfg.mask_truncated_completions:  # out of the loss and of every normaliser (grpo.py)
        mask = mask & ~rollouts.truncated[:, None]
    advantages = group_advantages(
        torch.tensor(scores, dtype=torch.float32), cfg.group_size, cfg.scale_rewards
    )
    low, high = cfg.clip_bounds
    stats = backbone_backward(
        model,
        rollouts.prompt_ids,
        rollouts.prompt_mask,
        rollouts.completion_ids,
        mask,
        advantages,
        clip_eps=1.0 - low,
        clip_high=high - 1.0,
        beta=cfg.beta,
        ref_model=inputs.ref_model,
        weights=token_weights(mask, cfg.loss_type, cfg.max_new_tokens),
        micro_batch_size=cfg.micro_batch_size,
        share=shards.share(len(rollouts.texts)),
        scale=float(shards.world),
        # sharded: every rank must run the same forwards (FSDP's collectives), so no
        # rank may skip rows the others run: the plain step
        plain=cfg.plain_step or shards.sharded,
    )
    if completions is not None:
        completions.add(step + 1, answered, rollouts, scores, advantages)
    loss, kl = shards.total([stats.loss, stats.kl])
    backbone_s = time.perf_counter() - t
    if not math.isfinite(loss):
        raise cd.diverged(step + 1, "the GRPO loss")
    # clipping (off by default) acts on the backbone gradient only, as in the TRL route
    norm = torch.nn.utils.clip_grad_norm_(cd.params, cfg.max_grad_norm or math.inf)
    grad_norm = float(whole(norm))

    cd.before_update(step + 1, status)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    cd.after_update(step + 1, status)
    return {
        "step": step + 1,
        **reward_columns,
        "loss": loss,
        "kl": kl,
        "grad_norm_rl": grad_norm,
        "lr": lr,
        "completion_tokens": stats.tokens,
        "skipped_fraction": stats.skipped_fraction,
        **cd.log_fields({"rollout_s": rollout_s, "backbone_s": backbone_s}, audit_b_shared),
        "step_s": time.perf_counter() - began,
    }
