"""eval: sample, verify and score unbiased pass@k per benchmark (SPEC §7); contamination audit."""

from __future__ import annotations

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
    user_errors,
)
from cdscope.cli.options import annotated, with_settings
from cdscope.errors import CdscopeError
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import DEFAULT_MAX_NEW_TOKENS, EvalSettings, ModelSettings

if TYPE_CHECKING:  # pandas loads with the workflow, not for --help
    import pandas as pd


@app.command("eval")
@user_errors
@with_settings(ModelSettings, "model_settings")
def eval_command(
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help=f"Model: hub id, local directory, .gguf, or '{EMBEDDED_NAME}' (default). Repeat to "
            "compare models. With --audit and no --model, only the audit runs.",
        ),
    ] = None,
    tasks: Annotated[
        list[Path] | None,
        typer.Option(
            "--tasks",
            help="Task file(s): JSONL, Parquet or a datasets save_to_disk folder, in cdscope's "
            "format or GSM8K / MATH / HumanEval / MBPP columns (default: the shipped eval sets).",
        ),
    ] = None,
    task_columns: TaskColumnsOpt = None,
    n: annotated(EvalSettings, "n") = EvalSettings.n,
    k: Annotated[str, typer.Option("--k", help="Comma-separated k values for pass@k.")] = ",".join(
        map(str, EvalSettings.ks)
    ),
    temperature: annotated(EvalSettings, "temperature") = EvalSettings.temperature,
    top_p: annotated(EvalSettings, "top_p") = EvalSettings.top_p,
    max_new_tokens: Annotated[
        str | None,
        typer.Option(
            "--max-new-tokens",
            help="N for every domain, or DOMAIN=N,... [default: "
            + ", ".join(f"{d}={n}" for d, n in DEFAULT_MAX_NEW_TOKENS.items())
            + "].",
        ),
    ] = None,
    seed: annotated(EvalSettings, "seed") = EvalSettings.seed,
    limit: annotated(EvalSettings, "limit") = None,
    batch_size: annotated(EvalSettings, "batch_size") = None,
    backend: annotated(EvalSettings, "backend") = EvalSettings.backend,
    hard: Annotated[
        Path | None, typer.Option("--hard", help="File of task ids (one per line): hard subset.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path("results/eval"),
    resume: ResumeOpt = False,
    recompute: RecomputeOpt = False,
    plot: PlotOpt = None,
    audit: Annotated[
        bool, typer.Option("--audit", help="Audit the eval sets against train + probe sets.")
    ] = False,
    audit_train: Annotated[
        list[Path] | None,
        typer.Option(
            "--audit-train", help="Training task JSONL(s) to audit against (default: shipped)."
        ),
    ] = None,
    audit_probe: Annotated[
        list[Path] | None,
        typer.Option(
            "--audit-probe", help="Probe pool JSONL(s) to audit against (default: shipped)."
        ),
    ] = None,
    timeout: annotated(EvalSettings, "timeout") = EvalSettings.timeout,
    workers: annotated(EvalSettings, "workers") = EvalSettings.workers,
    as_json: JsonOpt = False,
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Sample n completions per problem, verify them, report unbiased pass@k (SPEC §7).

    pass@k per benchmark (mean over problems), per domain (mean of its benchmarks) and
    overall (mean of domains), plus the --hard subset. Writes OUT/samples.parquet (one
    row per sample: completion, passed, verifier message, tokens) and OUT/passk.parquet.
    """
    from cdscope.commands.evaluate import check_backend, eval_outputs, evaluate, read_hard_ids
    from cdscope.io import check_plot_path, check_writable
    from cdscope.output.frames import ModelOptions
    from cdscope.settings import parse_ks, parse_max_new_tokens
    from cdscope.tasks import default_task_paths, load_tasks

    options = ModelOptions.from_settings(model_settings)
    resume_with = resume_arg(resume, recompute)
    task_paths = list(tasks) if tasks else default_task_paths("eval")
    loaded_tasks = load_tasks(task_paths, columns=task_columns)
    token_caps = parse_max_new_tokens(max_new_tokens)
    unknown = sorted(set(token_caps) - {"*"} - {t.family for t in loaded_tasks})
    if unknown:
        raise CdscopeError(
            f"--max-new-tokens names domain(s) {', '.join(unknown)} that no loaded task has "
            f"(domains: {', '.join(sorted({t.family for t in loaded_tasks}))})"
        )
    settings = EvalSettings(
        n=n,
        ks=tuple(parse_ks(k)),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        max_new_tokens=token_caps,
        limit=limit,
        batch_size=batch_size,
        backend=backend,
        timeout=timeout,
        workers=workers,
    )
    run_models = bool(model) or not audit
    if run_models:
        from cdscope.analysis.passk import check_ks

        check_ks(settings.ks, n)
        check_backend(backend)
        check_writable(out / "samples.parquet")
        if plot is not None:
            check_plot_path(plot)
    hard_ids = read_hard_ids(hard, loaded_tasks) if hard else None
    tables: dict[str, pd.DataFrame] = {}  # --json: one object with every table shown
    outputs: dict[str, str] = {}
    with eval_outputs(out, run_models, audit, plot) as files:  # locked now, committed together
        if audit:
            from cdscope.commands.evaluate import contamination_audit

            frame, target = contamination_audit(
                loaded_tasks, task_paths, audit_train, audit_probe, out, files
            )
            tables["contamination"], outputs["contamination"] = frame, str(target)
        if run_models:
            result = evaluate(
                models_or_embedded(model), loaded_tasks, settings, out, options, resume_with,
                hard_ids, err_console, files,
            )  # fmt: skip
            if plot is not None:
                from cdscope.output.plots import plot_passk

                plot_passk(
                    files.path(plot), result.passk, list(dict.fromkeys(models_or_embedded(model)))
                )
    if audit:
        from cdscope.output.render import contamination_table

        if not as_json:
            out_console.print(contamination_table(tables["contamination"]))
        wrote(err_console, outputs["contamination"])
    if not run_models:
        if as_json:
            print_json("eval", tables, outputs=outputs)
        return
    if as_json:
        tables |= {"passk": result.passk, "stats": result.stats}
        outputs |= {"samples": str(out / "samples.parquet"), "passk": str(out / "passk.parquet")}
        print_json("eval", tables, outputs=outputs)
    else:
        from cdscope.output.render_runs import passk_table, stats_table

        out_console.print(passk_table(result.passk, list(dict.fromkeys(models_or_embedded(model)))))
        out_console.print(stats_table(result.stats))
    if plot is not None:
        wrote(err_console, str(plot))
    wrote(
        err_console,
        f"{out / 'samples.parquet'} ({len(result.samples)} samples) and {out / 'passk.parquet'}",
    )
