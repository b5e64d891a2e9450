"""train: GRPO post-training with the CD-RFT regulariser (SPEC §5)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cdscope.cli.common import (
    JsonOpt,
    ProbeOpt,
    TaskColumnsOpt,
    app,
    err_console,
    out_console,
    print_json,
    user_errors,
)
from cdscope.messages import wrote
from cdscope.train.config import cli_fields


def _opt(name: str) -> Any:
    """The option of TrainConfig field ``name``: flag, help and default from its metadata."""
    spec = _FIELDS[name]
    default = spec.default
    suffix = f" [default: {default}]" if default is not None and default is not False else ""
    return typer.Option(
        spec.metadata["flag"], help=spec.metadata["help"] + suffix, show_default=False
    )


_FIELDS = {f.name: f for f in cli_fields()}
Str = str | None
Int = int | None
Float = float | None


@app.command()
@user_errors
def train(
    model: Annotated[Str, _opt("model")] = None,
    revision: Annotated[Str, _opt("revision")] = None,
    trust_remote_code: Annotated[bool | None, _opt("trust_remote_code")] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Run folder.")] = Path(
        "runs/train"
    ),
    steps: Annotated[Int, _opt("steps")] = None,
    prompts_per_step: Annotated[Int, _opt("prompts_per_step")] = None,
    group_size: Annotated[Int, _opt("group_size")] = None,
    max_new_tokens: Annotated[Int, _opt("max_new_tokens")] = None,
    temperature: Annotated[Float, _opt("temperature")] = None,
    lr: Annotated[Float, _opt("lr")] = None,
    beta: Annotated[Float, _opt("beta")] = None,
    regularizer: Annotated[Str, _opt("regularizer")] = None,
    lam: Annotated[Float, _opt("lam")] = None,
    tau: Annotated[Float, _opt("tau")] = None,
    k_max: Annotated[Int, _opt("k_max")] = None,
    eta_proj: Annotated[Float, _opt("eta_proj")] = None,
    eps: Annotated[Float, _opt("eps")] = None,
    estimator: Annotated[Str, _opt("estimator")] = None,
    granularity: Annotated[Str, _opt("granularity")] = None,
    probe_n: Annotated[Int, _opt("probe_n")] = None,
    probe: ProbeOpt = None,
    template: Annotated[Str, _opt("template")] = None,
    seed: Annotated[Int, _opt("seed")] = None,
    save_every: Annotated[Int, _opt("save_every")] = None,
    micro_batch_size: Annotated[Int, _opt("micro_batch_size")] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue the run in --out-dir from its latest checkpoint."),
    ] = False,
    tasks: Annotated[
        list[Path] | None,
        typer.Option(
            "--tasks",
            help="Training task file(s): JSONL, Parquet or a datasets save_to_disk folder, in "
            "cdscope's format or GSM8K / MATH / HumanEval / MBPP columns (default: the shipped "
            "train sets).",
        ),
    ] = None,
    task_columns: TaskColumnsOpt = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset", help="reference (SPEC §5 defaults) | cpu-smoke (a few minutes on CPU)."
        ),
    ] = None,
    backend: Annotated[Str, _opt("backend")] = None,
    sharding: Annotated[Str, _opt("sharding")] = None,
    activation_checkpointing: Annotated[bool | None, _opt("activation_checkpointing")] = None,
    report_to: Annotated[Str, _opt("report_to")] = None,
    trl_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--trl-arg",
            help="KEY=VALUE passed to TRL's GRPOConfig with --backend trl (repeatable), "
            "e.g. use_vllm=true, vllm_mode=server.",
        ),
    ] = None,
    device: Annotated[Str, _opt("device")] = None,
    dtype: Annotated[Str, _opt("dtype")] = None,
    as_json: JsonOpt = False,
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
    from cdscope.tasks.readers import with_mapping
    from cdscope.train.config import TrainConfig

    given = locals()
    explicit: dict[str, Any] = {
        name: given[name] for name in _FIELDS if given[name] is not None
    }  # unset options keep the preset's or TrainConfig's default
    explicit.update(
        out_dir=str(out_dir),
        tasks=tuple(with_mapping(p, task_columns) for p in tasks or ()),
        probe_files=tuple(str(p) for p in probe or ()),
    )
    if trl_arg:
        explicit["extra"] = {"trl": _key_values(trl_arg)}
    cfg = TrainConfig().with_preset(preset, explicit)
    result = run_train(cfg, resume=resume, console=err_console)
    if as_json:
        outputs = {"log": str(result.out_dir / "log.parquet")}
        if result.final_dir is not None:
            outputs["final"] = str(result.final_dir)
        print_json("train", {"log": result.log}, outputs=outputs)
    else:
        from cdscope.output.render_runs import train_table

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
