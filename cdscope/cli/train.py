"""train: GRPO post-training with the CD-RFT regulariser (SPEC §5)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cdscope.cli.common import (
    DeviceOpt,
    ProbeOpt,
    TemplateOpt,
    app,
    err_console,
    out_console,
    user_errors,
)
from cdscope.messages import wrote
from cdscope.regularizer import DEFAULT_EPS, DEFAULT_ESTIMATOR

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

Int = int | None
Float = float | None


def _opt(flag: str, text: str, default: Any = None) -> Any:
    suffix = f" [default: {default}]" if default is not None else ""
    return typer.Option(flag, help=text + suffix, show_default=False)


@app.command()
@user_errors
def train(
    model: Annotated[str | None, _opt("--model", "Model to train.", "smollm2-135m")] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Run folder.")] = Path(
        "runs/train"
    ),
    steps: Annotated[
        Int, _opt("--steps", "Optimizer steps (total, also for --resume).", 200)
    ] = None,
    prompts_per_step: Annotated[Int, _opt("--prompts-per-step", "Prompts per step.", 8)] = None,
    group_size: Annotated[Int, _opt("--group-size", "Samples G per prompt.", 4)] = None,
    max_new_tokens: Annotated[Int, _opt("--max-new-tokens", "Rollout length cap.", 512)] = None,
    temperature: Annotated[Float, _opt("--temperature", "Rollout temperature.", 0.6)] = None,
    lr: Annotated[Float, _opt("--lr", "AdamW peak learning rate (cosine decay).", 2e-6)] = None,
    beta: Annotated[Float, _opt("--beta", "k3 KL coefficient vs the initial model.", 0.0)] = None,
    regularizer: Annotated[
        str | None, _opt("--regularizer", "none (GRPO) | cdrft (GRPO + CD-RFT).", "cdrft")
    ] = None,
    lam: Annotated[Float, _opt("--lambda", "Regulariser weight lambda.", 1.0)] = None,
    tau: Annotated[
        Float,
        _opt("--tau", "Projection threshold on B_shared, percent, between 100/M and 100.", 70.0),
    ] = None,
    k_max: Annotated[Int, _opt("--k-max", "Max projection iterations per step.", 12)] = None,
    eta_proj: Annotated[Float, _opt("--eta-proj", "Projection step size.", 4e-3)] = None,
    eps: Annotated[Float, _opt("--eps", "Gate step of the proxy gradient.", DEFAULT_EPS)] = None,
    estimator: Annotated[
        str | None,
        _opt("--estimator", "Regulariser gradient: exact | proxy | richardson.", DEFAULT_ESTIMATOR),
    ] = None,
    probe_n: Annotated[Int, _opt("--probe-n", "Probe samples per family.", 3)] = None,
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    seed: Annotated[Int, _opt("--seed", "Seed of data order, rollouts and probe.", 0)] = None,
    save_every: Annotated[Int, _opt("--save-every", "Checkpoint every N steps.", 50)] = None,
    micro_batch_size: Annotated[
        Int, _opt("--micro-batch-size", "Completions per backbone forward (memory).", 8)
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue the run in --out-dir from its latest checkpoint."),
    ] = False,
    tasks: Annotated[
        list[Path] | None,
        typer.Option(
            "--tasks", help="Training task JSONL file(s) (default: the shipped train sets)."
        ),
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset", help="reference (SPEC §5 defaults) | cpu-smoke (a few minutes on CPU)."
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="hf (built-in loop) | trl (GRPOTrainer).")
    ] = "hf",
    trl_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--trl-arg",
            help="KEY=VALUE passed to TRL's GRPOConfig with --backend trl (repeatable), "
            "e.g. use_vllm=true, vllm_mode=server.",
        ),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="auto (float32 on every device: bf16 loses AdamW updates and the "
            "regulariser's gate steps) | float32 | bfloat16 | float64.",
        ),
    ] = "auto",
) -> None:
    """GRPO post-training, with (cdrft) or without (none) the CD-RFT regulariser (SPEC §5).

    Per step: G rollouts per prompt, verifier rewards, group-normalised advantages,
    clipped per-token policy loss (+ beta k3 KL); with cdrft, lambda * grad R(C) on a fixed
    probe is added before the AdamW step, then the projection loop runs while B_shared >
    tau (at most K_max plain steps of size eta_proj). Both arms log B_shared and R on the
    probe before/after each step to OUT/log.parquet; checkpoints go to OUT/checkpoints
    (--resume continues exactly); the final model is a Hugging Face folder OUT/final.
    """
    from cdscope.commands.train import run_train
    from cdscope.train.config import TrainConfig

    given = {
        "model": model, "steps": steps, "prompts_per_step": prompts_per_step,
        "group_size": group_size, "max_new_tokens": max_new_tokens, "temperature": temperature,
        "lr": lr, "beta": beta, "regularizer": regularizer, "lam": lam, "tau": tau,
        "k_max": k_max, "eta_proj": eta_proj, "eps": eps, "estimator": estimator,
        "probe_n": probe_n, "seed": seed, "save_every": save_every,
        "micro_batch_size": micro_batch_size,
    }  # fmt: skip
    explicit: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    explicit.update(
        out_dir=str(out_dir), template=template, backend=backend, device=device, dtype=dtype,
        tasks=tuple(str(p) for p in tasks or ()), probe_files=tuple(str(p) for p in probe or ()),
    )  # fmt: skip
    if trl_arg:
        explicit["extra"] = {"trl": _key_values(trl_arg)}
    cfg = TrainConfig().with_preset(preset, explicit)
    result = run_train(cfg, resume=resume, console=err_console)
    out_console.print(train_table(result.log, cfg.regularizer))
    wrote(err_console, str(result.out_dir / "log.parquet"))
    if result.final_dir is not None:
        wrote(err_console, str(result.final_dir), "final model")


def _key_values(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> dict; values parsed as JSON where they are (true, 0.5, ...)."""
    import json

    from cdscope.errors import CdscopeError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CdscopeError(f"--trl-arg takes KEY=VALUE (like use_vllm=true); got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def train_table(log: pd.DataFrame, arm: str) -> Table:
    """One row per step: rewards, loss, B_shared / R on the probe before -> after, timings."""
    from cdscope.messages import VerbatimTable

    table = VerbatimTable(title=f"cdscope train ({arm})")
    rewards = [c for c in log.columns if c.startswith("reward_")]
    for name in ["step", "reward", *rewards, "loss", "B_shared %", "R %", "proj", "seconds"]:
        table.add_column(name, justify="right")
    for row in log.itertuples(index=False):
        r = row._asdict()
        table.add_row(
            str(r["step"]),
            f"{r['reward']:.3f}",
            *[f"{r[c]:.3f}" for c in rewards],
            f"{r['loss']:+.4f}",
            f"{100 * r['b_shared_before']:.2f} -> {100 * r['b_shared_after']:.2f}",
            f"{100 * r['r_before']:.2f} -> {100 * r['r_after']:.2f}",
            str(r["proj_iters"]),
            f"{r['step_s']:.1f}",
        )
    return table
