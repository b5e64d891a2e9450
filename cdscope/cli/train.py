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
    tasks_option,
    user_errors,
)
from cdscope.cli.options import with_settings
from cdscope.cli.params import key_values
from cdscope.messages import wrote
from cdscope.settings.training import TrainConfig

OutDirOpt = Annotated[Path, typer.Option("--out-dir", "-o", help="Run folder.")]
ResumeRunOpt = Annotated[
    bool, typer.Option("--resume", help="Continue the run in --out-dir from its latest checkpoint.")
]
TrainTasksOpt = tasks_option("Training task", "train")
PresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset", help="reference (SPEC §5 defaults) | cpu-smoke (a few minutes on CPU)."
    ),
]
EvalTasksOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--eval-tasks",
        help="Held-out task file(s) of --eval-every (default: the held-out split of --tasks: "
        ".../eval/NAME beside each .../train/NAME, else the shipped eval sets).",
    ),
]
EvalKOpt = Annotated[
    str | None, typer.Option("--eval-k", help="k values of --eval-every's pass@k [default: 1].")
]
AuditProbeOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--audit-probe",
        help="Probe pool file(s) of --audit-every (default: the audit half of the training "
        "pool, which shares no item with the training probe).",
    ),
]
TrlArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--trl-arg",
        help="KEY=VALUE passed to TRL's GRPOConfig with --backend trl (repeatable), "
        "e.g. use_vllm=true, vllm_mode=server.",
    ),
]


# The TrainConfig options are generated (``with_settings``, unset: the preset or the
# dataclass decides what is not given); the parameters below are train's own options.
@app.command("train")
@user_errors
@with_settings(TrainConfig, "explicit", unset=True)
def train_command(  # size: 12 parameters, each one command-line option (Typer reads the signature)
    out_dir: OutDirOpt = Path("runs/train"),
    probe: ProbeOpt = None,
    resume: ResumeRunOpt = False,
    tasks: TrainTasksOpt = None,
    task_columns: TaskColumnsOpt = None,
    eval_tasks: EvalTasksOpt = None,
    eval_k: EvalKOpt = None,
    audit_probe: AuditProbeOpt = None,
    preset: PresetOpt = None,
    trl_arg: TrlArgOpt = None,
    as_json: JsonOpt = False,
    explicit: dict[str, Any] | None = None,
) -> None:
    """GRPO post-training, with (cdrft) or without (none) the CD-RFT regulariser (SPEC §5).

    Per step: G rollouts per prompt, verifier rewards, group-normalised advantages,
    clipped per-token policy loss (+ beta k3 KL); with cdrft, lambda * grad R(C) on a fixed
    probe is added before the AdamW step, then the projection loop runs while B_shared >
    tau (at most K_max plain steps of size eta_proj). Both arms log B_shared and R on the
    probe before/after each step to OUT/log.parquet; checkpoints go to OUT/checkpoints
    (--resume continues exactly); the final model is a Hugging Face folder OUT/final.
    The training probe comes from the train half of the pool; --eval-every and
    --audit-every log held-out pass@k (OUT/eval.parquet) and B_shared on the audit half
    (OUT/audit.parquet) while it trains (docs/train.md).
    """
    from cdscope.commands.train import run_train
    from cdscope.settings import parse_ks
    from cdscope.tasks.io import with_mapping

    explicit = dict(explicit or {})  # the TrainConfig options given
    explicit.update(
        out_dir=str(out_dir),
        tasks=tuple(with_mapping(p, task_columns) for p in tasks or ()),
        probe_files=tuple(str(p) for p in probe or ()),
        eval_tasks=tuple(str(p) for p in eval_tasks or ()),
        audit_probe=tuple(str(p) for p in audit_probe or ()),
    )
    if eval_k is not None:
        explicit["eval_k"] = tuple(parse_ks(eval_k))
    if trl_arg:
        explicit["extra"] = {"trl": key_values(trl_arg, "--trl-arg", "use_vllm=true")}
    cfg = TrainConfig().with_preset(preset, explicit)
    result = run_train(cfg, resume=resume, console=err_console)
    if as_json:
        outputs = {"log": str(result.out_dir / "log.parquet")}
        for name, frame in (("eval", result.eval), ("audit", result.audit)):
            if frame is not None:
                outputs[name] = str(result.out_dir / f"{name}.parquet")
        if result.final_dir is not None:
            outputs["final"] = str(result.final_dir)
        tables = {"log": result.log}
        tables.update(
            {k: v for k, v in (("eval", result.eval), ("audit", result.audit)) if v is not None}
        )
        print_json("train", tables, outputs=outputs)
    else:
        from cdscope.output.render_runs import evidence_table, train_table

        out_console.print(train_table(result.log, cfg.regularizer))
        if result.eval is not None or result.audit is not None:
            out_console.print(evidence_table(result.log, result.audit, result.eval))
    wrote(err_console, str(result.out_dir / "log.parquet"))
    for name, frame in (("eval", result.eval), ("audit", result.audit)):
        if frame is not None:
            wrote(err_console, str(result.out_dir / f"{name}.parquet"), f"held-out {name}")
    if result.final_dir is not None:
        wrote(err_console, str(result.final_dir), "final model")
