"""CD-RFT on TRL's ``GRPOTrainer`` (multi-GPU with ``accelerate launch``, vLLM rollouts).

The backbone is TRL's: its rollouts, its GRPO loss (``loss_type="dapo"``: the mean over
every completion token of the generation batch, the same normalisation as
``cdscope.train.grpo``), its gradient accumulation. CD-RFT enters through the narrowest
public hook, a ``TrainerCallback``:

* ``on_pre_optimizer_step`` — called once per optimizer step, after every micro-batch's
  backward has accumulated (and after TRL's gradient clipping, which so acts on the
  backbone gradient only, as in the hf loop): B_shared / R on the probe (carried over
  from the previous step's closing measurement, at the same theta) and
  lambda * grad R(C(theta)) is added to ``.grad`` — once per optimizer step, never once
  per micro-batch, so gradient accumulation does not rescale it;
* ``on_optimizer_step`` — right after ``optimizer.step()``: the projection loop
  (``cdscope.train.cdrft.project``) while B_shared > tau and fewer than K_max iterations;
* ``on_log`` — merges TRL's per-step metrics (reward, loss, KL) with the probe
  measurements into ``OUT/log.parquet`` (atomic writes).

Under DDP every rank holds the full parameters and the same probe, so each computes the
same regulariser gradient (deterministic); ZeRO-3 / FSDP sharding is not supported by
the callback (the probe forward needs whole parameters).

Differences from the hf loop, by design of TRL: the data order is TRL's seeded sampler,
TRL scores log-probs of temperature-scaled logits, and checkpoints / ``--resume`` use
the Trainer's own ``checkpoint-N`` folders under ``OUT/trl``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from cdscope.errors import CdscopeError, missing_extra
from cdscope.gates import GatedModel
from cdscope.io import read_parquet, write_parquet
from cdscope.messages import dim, make_console
from cdscope.tasks.format import Task
from cdscope.train.cdrft import (
    ProbeMeasure,
    ProjectionResult,
    add_regularizer_grad,
    finite_params,
    measure,
    probe_rows_per_forward,
    project,
)
from cdscope.train.loop import (
    LOG_NAME,
    TrainInputs,
    TrainResult,
    save_final_model,
    verifier_rewards,
)

try:  # optional extra: pip install 'cdscope[trl]'
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    TRL_IMPORT_ERROR: str | None = None
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    TrainerCallback = object  # type: ignore[assignment,misc]
    TRL_IMPORT_ERROR = str(_exc)


def require_trl() -> None:
    if TRL_IMPORT_ERROR is not None:
        raise missing_extra("--backend trl", "trl", TRL_IMPORT_ERROR)


class CDRFTCallback(TrainerCallback):  # type: ignore[misc]
    """Adds the CD-RFT step (SPEC §5 steps 2 and 4) to any Trainer's optimizer steps."""

    def __init__(
        self, inputs: TrainInputs, gm: GatedModel, rewards: RewardRecorder, resume: bool = False
    ) -> None:
        self.inputs, self.gm, self.rewards = inputs, gm, rewards
        self.params = [p for p in inputs.model.parameters() if p.requires_grad]
        self.probe_bs = probe_rows_per_forward(inputs.cfg.probe_batch_size, inputs.model)
        log_path = Path(inputs.cfg.out_dir) / LOG_NAME
        # on --resume the log keeps the rows of the steps the checkpoint already holds
        self.rows: list[dict[str, Any]] = (
            read_parquet(log_path)[0].to_dict("records") if resume and log_path.is_file() else []
        )
        self.pending: dict[str, Any] = {}
        self.resumed_from: int | None = None
        # the closing measurement of a step is at the theta the next one opens with
        # (rollouts and backward passes do not move it), as in the hf loop
        self.carried: ProbeMeasure | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the Trainer has loaded the checkpoint's state by now: drop rows of later steps
        # (logged before an interruption, then lost with their unsaved checkpoint)
        if self.rows or state.global_step:
            self.resumed_from = state.global_step
            self.rows = [r for r in self.rows if r["step"] <= state.global_step]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.perf_counter()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        cfg, probe = self.inputs.cfg, self.inputs.probe
        t = time.perf_counter()
        before = self.carried or measure(self.gm, probe, self.probe_bs)
        self.pending = {"b_shared_before": before.b_shared, "r_before": before.R}
        self.pending["measure_s"] = time.perf_counter() - t
        t = time.perf_counter()
        reg_R = float("nan")  # noqa: N806
        if cfg.regularizer == "cdrft" and cfg.lam > 0:
            reg_R = add_regularizer_grad(  # noqa: N806
                self.gm,
                probe,
                self.params,
                cfg.lam,
                cfg.estimator,
                cfg.eps,
                self.probe_bs,
                at=before,
            ).R
        self.pending.update(r_regularizer=reg_R, regularizer_s=time.perf_counter() - t)
        if not finite_params(self.params):
            raise CdscopeError(
                f"training diverged at step {state.global_step + 1}: the gradient is not finite; "
                "stopped before applying it; lower --lr and resume from the last checkpoint"
            )

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        cfg, probe = self.inputs.cfg, self.inputs.probe
        t = time.perf_counter()
        after = measure(self.gm, probe, self.probe_bs)
        self.pending["measure_s"] += time.perf_counter() - t
        if cfg.regularizer == "cdrft":
            proj = project(
                self.gm, probe, self.params, cfg.tau, cfg.k_max, cfg.eta_proj, cfg.estimator,
                cfg.eps, self.probe_bs, start=after,
            )  # fmt: skip
        else:
            proj = ProjectionResult(0, after, after, 0.0)
        self.carried = proj.after
        self.pending.update(
            step=state.global_step + 1,
            b_shared_after_update=after.b_shared,
            b_shared_after=proj.after.b_shared,
            r_after=proj.after.R,
            proj_iters=proj.iterations,
            projection_s=proj.seconds,
            step_s=time.perf_counter() - getattr(self, "began", time.perf_counter()),
        )

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        if not self.pending or logs is None or "loss" not in logs:
            return
        row = {"step": self.pending["step"], **self.rewards.last}
        row.update(loss=float(logs["loss"]), kl=float(logs.get("kl", 0.0)))
        row.update(grad_norm_backbone=float(logs.get("grad_norm", math.nan)))
        row.update({k: v for k, v in self.pending.items() if k != "step"})
        self.rows.append(row)
        self.pending = {}
        if state.is_world_process_zero:  # every rank holds the same rows; one writes them
            write_parquet(
                pd.DataFrame(self.rows),
                Path(self.inputs.cfg.out_dir) / LOG_NAME,
                self.inputs.metadata,
            )


class RewardRecorder:
    """TRL reward function from the shared verifiers; remembers per-family means for the log."""

    __name__ = "verifier"

    def __init__(self, inputs: TrainInputs) -> None:
        self.inputs = inputs
        self.last: dict[str, float] = {}

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], task_index: Sequence[int],
        **kwargs: Any,
    ) -> list[float]:  # fmt: skip
        tasks: list[Task] = [self.inputs.tasks[int(i)] for i in task_index]
        texts = [c if isinstance(c, str) else str(c) for c in completions]
        cfg = self.inputs.cfg
        if self.inputs.reward_fn is not None:
            scores = list(self.inputs.reward_fn(tasks, texts))
        else:
            scores = verifier_rewards(tasks, texts, cfg.verify_timeout, cfg.verify_workers)
        self.last = {"reward": sum(scores) / len(scores)}
        for family in self.inputs.families:
            picked = [s for t, s in zip(tasks, scores, strict=True) if t.family == family]
            self.last[f"reward_{family}"] = sum(picked) / len(picked) if picked else math.nan
        return scores


def per_rank_batches(completions: int, micro_batch_size: int, world_size: int) -> tuple[int, int]:
    """(per-device micro-batch, accumulation steps) so one optimizer step is ``completions``.

    TRL's generation batch per optimizer step is per_device x world_size x accumulation
    steps, so each of ``world_size`` processes takes completions / world_size of them.
    """
    if completions % world_size:
        raise CdscopeError(
            f"prompts x group size = {completions} completions per step cannot be split over "
            f"{world_size} processes; choose --prompts-per-step so that it divides"
        )
    per_rank = completions // world_size
    micro = max(d for d in range(1, min(micro_batch_size, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def grpo_config(inputs: TrainInputs, **overrides: Any) -> Any:
    """The GRPOConfig equivalent of ``inputs.cfg`` (one optimizer step = P x G completions,
    over all processes of an ``accelerate launch``, whose count is ``WORLD_SIZE``)."""
    require_trl()
    cfg = inputs.cfg
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    micro, accumulation = per_rank_batches(cfg.num_completions, cfg.micro_batch_size, world_size)
    device = str(next(inputs.model.parameters()).device)
    values: dict[str, Any] = dict(
        output_dir=str(Path(cfg.out_dir) / "trl"),
        max_steps=cfg.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        num_generations=cfg.group_size,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm or 0.0,
        beta=cfg.beta,
        epsilon=cfg.clip_eps,
        use_bias_correction_kl=False,  # SPEC §5: the plain k3 KL (TRL >= 1.x defaults to True)
        loss_type="dapo",
        scale_rewards="group",
        seed=cfg.seed,
        logging_steps=1,
        save_steps=cfg.save_every,
        report_to="none",
        use_cpu=device == "cpu",
        bf16=False,
        # TRL turns activation checkpointing on by default; the probe's gate-gradient
        # backward (torch.autograd.grad w.r.t. the gates) cannot run through it
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    if overrides.get("gradient_checkpointing"):
        raise CdscopeError(
            "--trl-arg gradient_checkpointing=true: the probe's gate-gradient backward cannot "
            "run through activation checkpointing; leave it off"
        )
    values.update(overrides)
    try:
        return GRPOConfig(**values)
    except (TypeError, ValueError) as exc:
        raise CdscopeError(f"TRL GRPOConfig refused the settings: {exc}") from exc


def train_with_trl(
    inputs: TrainInputs, resume: bool = False, console: Console | None = None, **overrides: Any
) -> TrainResult:
    """Run ``inputs.cfg`` through ``GRPOTrainer`` with the CD-RFT callback."""
    require_trl()
    from datasets import Dataset

    console = console or make_console()
    trl_dir = Path(inputs.cfg.out_dir) / "trl"
    if not resume and any(trl_dir.glob("checkpoint-*")):
        raise CdscopeError(
            f"{trl_dir} already holds a TRL run; pass --resume to continue it "
            "or choose another --out-dir"
        )
    dataset = Dataset.from_list(
        [{"prompt": t.prompt, "task_index": i} for i, t in enumerate(inputs.tasks)]
    )
    rewards = RewardRecorder(inputs)
    with GatedModel(inputs.model) as gm:
        callback = CDRFTCallback(inputs, gm, rewards, resume)
        trainer = GRPOTrainer(
            model=inputs.model,
            reward_funcs=[rewards],
            args=grpo_config(inputs, **overrides),
            train_dataset=dataset,
            processing_class=inputs.tokenizer,
            callbacks=[callback],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step table goes to the log instead
        dim(console, f"TRL GRPOTrainer: {inputs.cfg.steps} steps, {inputs.cfg.regularizer}")
        trainer.train(resume_from_checkpoint=True if resume else None)
    final = None
    if trainer.is_world_process_zero():
        final = save_final_model(inputs.model, inputs.tokenizer, Path(inputs.cfg.out_dir) / "final")
    log = pd.DataFrame(callback.rows)
    steps_done = int(trainer.state.global_step)
    return TrainResult(Path(inputs.cfg.out_dir), log, steps_done, callback.resumed_from, final)
