"""eval: sample, verify and score unbiased pass@k per benchmark (SPEC §7); contamination audit."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cdscope.cli.common import (
    JsonOpt,
    PlotOpt,
    RecomputeOpt,
    ResumeOpt,
    TaskColumnsOpt,
    app,
    err_console,
    models_or_embedded,
    out_console,
    print_json,
    resume_arg,
    tasks_option,
    user_errors,
)
from cdscope.cli.options import with_settings
from cdscope.cli.params import key_values
from cdscope.errors import CdscopeError
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import DEFAULT_MAX_NEW_TOKENS, EvalSettings, ModelSettings, parse_ks

if TYPE_CHECKING:  # pandas and the workflow load with the run, not for --help
    import pandas as pd

    from cdscope.commands.evaluate import EvalResult
    from cdscope.commands.requests import EvalRequest
    from cdscope.fileset import FileSet

EvalModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help=f"Model: hub id, local directory, .gguf, or '{EMBEDDED_NAME}' (default). Repeat to "
        "compare models. With --audit and no --model, only the audit runs.",
    ),
]
TasksOpt = tasks_option("Task", "eval")
KOpt = Annotated[str, typer.Option("--k", help="Comma-separated k values for pass@k.")]
MaxNewTokensOpt = Annotated[
    str | None,
    typer.Option(
        "--max-new-tokens",
        help="N for every domain, or DOMAIN=N,... [default: "
        + ", ".join(f"{d}={n}" for d, n in DEFAULT_MAX_NEW_TOKENS.items())
        + "].",
    ),
]
HardOpt = Annotated[
    Path | None, typer.Option("--hard", help="File of task ids (one per line): hard subset.")
]
OutDirOpt = Annotated[Path, typer.Option("--out", "-o", help="Output folder.")]
AuditOpt = Annotated[
    bool, typer.Option("--audit", help="Audit the eval sets against train + probe sets.")
]
AuditTrainOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--audit-train", help="Training task JSONL(s) to audit against (default: shipped)."
    ),
]
VllmArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vllm-arg",
        help="KEY=VALUE passed to vLLM's LLM(...) with --backend vllm (repeatable), e.g. "
        "tensor_parallel_size=2, gpu_memory_utilization=0.8, enforce_eager=false.",
    ),
]
AuditProbeOpt = Annotated[
    list[Path] | None,
    typer.Option("--audit-probe", help="Probe pool JSONL(s) to audit against (default: shipped)."),
]


# A command's parameters are its options (Typer reads them from the signature): the
# signature is the option list, the body below it stays short. EvalSettings' and
# ModelSettings' options are generated (with_settings); --k and --max-new-tokens are parsed.
@app.command("eval")
@user_errors
@with_settings(ModelSettings, "model_settings")
@with_settings(EvalSettings, "eval_settings")
def eval_command(  # size: 17 parameters, each one command-line option (Typer reads the signature)
    model: EvalModelOpt = None,
    tasks: TasksOpt = None,
    task_columns: TaskColumnsOpt = None,
    k: KOpt = ",".join(map(str, EvalSettings.ks)),
    max_new_tokens: MaxNewTokensOpt = None,
    hard: HardOpt = None,
    out: OutDirOpt = Path("results/eval"),
    resume: ResumeOpt = False,
    recompute: RecomputeOpt = False,
    plot: PlotOpt = None,
    audit: AuditOpt = False,
    audit_train: AuditTrainOpt = None,
    audit_probe: AuditProbeOpt = None,
    vllm_arg: VllmArgOpt = None,
    as_json: JsonOpt = False,
    eval_settings: EvalSettings = EvalSettings(),
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Sample n completions per problem, verify them, report unbiased pass@k (SPEC §7).

    pass@k per benchmark (mean over problems), per domain (mean of its benchmarks) and
    overall (mean of domains), plus the --hard subset. Writes OUT/samples.parquet (one
    row per sample: completion, passed, verifier message, tokens) and OUT/passk.parquet.
    Generates with transformers (--backend hf), vLLM in this process (--backend vllm) or
    an OpenAI-compatible server (--endpoint URL); docs/eval.md.
    """
    from cdscope.commands.evaluate import contamination_audit, eval_outputs, read_hard_ids
    from cdscope.commands.requests import EvalRequest
    from cdscope.core.models.opening import ModelOptions
    from cdscope.tasks import default_task_paths, load_tasks

    options = ModelOptions.from_settings(model_settings)
    resume_with = resume_arg(resume, recompute)
    task_paths = list(tasks) if tasks else default_task_paths("eval")
    loaded_tasks = load_tasks(task_paths, columns=task_columns)
    settings = dataclasses.replace(
        eval_settings,
        ks=tuple(parse_ks(k)),
        max_new_tokens=_token_caps(max_new_tokens, loaded_tasks),
        vllm_args=key_values(vllm_arg or [], "--vllm-arg", "enforce_eager=false"),
    )
    run_models = bool(model) or bool(eval_settings.endpoint) or not audit
    request = EvalRequest(
        [] if eval_settings.endpoint else models_or_embedded(model), loaded_tasks, settings,
        out, options, resume_with, read_hard_ids(hard, loaded_tasks) if hard else None,
    )  # fmt: skip
    if run_models:
        _check_run(request, plot, model_given=bool(model))
    with eval_outputs(out, run_models, audit, plot) as files:  # locked now, committed together
        contamination = (
            contamination_audit(loaded_tasks, task_paths, audit_train, audit_probe, out, files)
            if audit
            else None
        )
        result = _run_models(request, plot, files) if run_models else None
    _show(request, result, contamination, plot, as_json)


def _token_caps(text: str | None, tasks: list) -> dict[str, int]:
    """``--max-new-tokens`` parsed; a domain no loaded task has is refused by name."""
    from cdscope.settings import parse_max_new_tokens

    caps = parse_max_new_tokens(text)
    domains = {t.family for t in tasks}
    unknown = sorted(set(caps) - {"*"} - domains)
    if unknown:
        raise CdscopeError(
            f"--max-new-tokens names domain(s) {', '.join(unknown)} that no loaded task has "
            f"(domains: {', '.join(sorted(domains))})"
        )
    return caps


def _check_run(request: EvalRequest, plot: Path | None, model_given: bool) -> None:
    """What sampling needs, checked before anything is locked or loaded."""
    from cdscope.analysis.passk import check_ks
    from cdscope.commands.engines import check_engine
    from cdscope.io import check_plot_path, check_writable

    check_ks(request.settings.ks, request.settings.n)
    check_engine(request.settings, request.options, model_given)
    check_writable(request.out_dir / "samples.parquet")
    if plot is not None:
        check_plot_path(plot)


def _run_models(request: EvalRequest, plot: Path | None, files: FileSet) -> EvalResult:
    """Sample, verify and score every model into the output set ``files`` (and the figure)."""
    from cdscope.commands.evaluate import evaluate

    result = evaluate(request, err_console, files)
    if plot is not None:
        from cdscope.output.plots import plot_passk

        plot_passk(files.path(plot), result.passk, result.models)
    return result


def _show(
    request: EvalRequest,
    result: EvalResult | None,
    contamination: tuple[pd.DataFrame, Path] | None,
    plot: Path | None,
    as_json: bool,
) -> None:
    """The tables (or one --json object with all of them) and the files written."""
    tables: dict[str, pd.DataFrame] = {}
    outputs: dict[str, str] = {}
    if contamination is not None:
        from cdscope.output.render import contamination_table

        tables["contamination"], outputs["contamination"] = contamination[0], str(contamination[1])
        if not as_json:
            out_console.print(contamination_table(contamination[0]))
        wrote(err_console, outputs["contamination"])
    if result is None:
        if as_json:
            print_json("eval", tables, outputs=outputs)
        return
    samples, passk = request.out_dir / "samples.parquet", request.out_dir / "passk.parquet"
    if as_json:
        tables |= {"passk": result.passk, "stats": result.stats}
        outputs |= {"samples": str(samples), "passk": str(passk)}
        print_json("eval", tables, outputs=outputs)
    else:
        from cdscope.output.render_runs import passk_table, stats_table

        out_console.print(passk_table(result.passk, result.models))
        out_console.print(stats_table(result.stats))
    if plot is not None:
        wrote(err_console, str(plot))
    wrote(err_console, f"{samples} ({len(result.samples)} samples) and {passk}")
