"""eval: sample, verify and score unbiased pass@k per benchmark (SPEC §7); contamination audit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    MaxMemoryOpt,
    OffloadDirOpt,
    PlotOpt,
    RecomputeOpt,
    ResumeOpt,
    RevisionOpt,
    TaskColumnsOpt,
    TrustRemoteCodeOpt,
    app,
    err_console,
    model_options,
    models_or_embedded,
    out_console,
    print_json,
    resume_arg,
    user_errors,
)
from cdscope.cli.params import COUNT_MAX, SEED_MAX, finite
from cdscope.errors import CdscopeError
from cdscope.messages import VerbatimTable, wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import DEFAULT_MAX_NEW_TOKENS, EvalSettings

if TYPE_CHECKING:  # pandas loads with the workflow, not for --help
    import pandas as pd
    from rich.table import Table


def parse_ks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CdscopeError(
            f"--k takes comma-separated integers like 1,5,10; got {text!r}"
        ) from None
    if not values:
        raise CdscopeError(f"--k takes comma-separated integers like 1,5,10; got {text!r}")
    return values


def parse_max_new_tokens(text: str | None) -> dict[str, int]:
    """'' -> {} (per-domain defaults); '128' -> every domain; 'code=256,math=128' -> those."""
    if not text:
        return {}
    out: dict[str, int] = {}
    try:
        if "=" not in text:
            out = {"*": int(text)}
        else:
            for part in filter(None, (p.strip() for p in text.split(","))):
                domain, value = part.split("=", 1)
                out[domain.strip()] = int(value)
    except ValueError:
        raise CdscopeError(
            f"--max-new-tokens takes N or DOMAIN=N,... (e.g. 128 or code=256,logic=192); got {text!r}"
        ) from None
    if any(not 1 <= v <= COUNT_MAX for v in out.values()):
        raise CdscopeError(
            f"--max-new-tokens values must lie in [1, {COUNT_MAX:,}] (tokens per completion); "
            f"got {text!r}"
        )
    return out


def stats_table(stats: pd.DataFrame) -> Table:
    import pandas as pd

    table = VerbatimTable(title="generation and verification", title_justify="left")
    for name in (
        "model",
        "problems",
        "samples",
        "empty",
        "tokens",
        "tokens/s",
        "generate s",
        "verify s",
        "verify share",
    ):
        table.add_column(name, justify="left" if name == "model" else "right")
    for row in stats.itertuples(index=False):
        table.add_row(
            row.model,
            str(row.problems),
            str(row.samples),
            str(row.empty),
            str(row.tokens),
            "-" if pd.isna(row.tokens_per_s) else f"{row.tokens_per_s:.1f}",
            f"{row.generate_s:.1f}",
            f"{row.verify_s:.1f}",
            "-" if pd.isna(row.verify_share) else f"{100 * row.verify_share:.1f}%",
        )
    return table


@app.command("eval")
@user_errors
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
    n: Annotated[
        int, typer.Option("--n", min=1, max=COUNT_MAX, help="Samples per problem.")
    ] = EvalSettings.n,
    k: Annotated[str, typer.Option("--k", help="Comma-separated k values for pass@k.")] = ",".join(
        map(str, EvalSettings.ks)
    ),
    temperature: Annotated[
        float,
        typer.Option(
            "--temperature", parser=finite(0, 100), help="Sampling temperature (0 = greedy)."
        ),
    ] = EvalSettings.temperature,
    top_p: Annotated[
        float,
        typer.Option("--top-p", parser=finite(0, 1, low_open=True), help="Nucleus sampling mass."),
    ] = EvalSettings.top_p,
    max_new_tokens: Annotated[
        str | None,
        typer.Option(
            "--max-new-tokens",
            help="N for every domain, or DOMAIN=N,... [default: "
            + ", ".join(f"{d}={n}" for d, n in DEFAULT_MAX_NEW_TOKENS.items())
            + "].",
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option("--seed", min=0, max=SEED_MAX, help="Run seed (per problem: seed x id)."),
    ] = EvalSettings.seed,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="First N problems of each benchmark.")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", "-b", min=1, help="Rows per generate call [default: n]."),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="hf | vllm (if installed).")
    ] = EvalSettings.backend,
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
    timeout: Annotated[
        float, typer.Option("--timeout", parser=finite(0.1, 3600), help="Seconds per code test.")
    ] = EvalSettings.timeout,
    workers: Annotated[
        int, typer.Option("--workers", min=1, max=256, help="Parallel code sandboxes.")
    ] = EvalSettings.workers,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_dir: OffloadDirOpt = None,
    revision: RevisionOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Sample n completions per problem, verify them, report unbiased pass@k (SPEC §7).

    pass@k per benchmark (mean over problems), per domain (mean of its benchmarks) and
    overall (mean of domains), plus the --hard subset. Writes OUT/samples.parquet (one
    row per sample: completion, passed, verifier message, tokens) and OUT/passk.parquet.
    """
    from cdscope.commands.evaluate import check_backend, eval_outputs, evaluate, read_hard_ids
    from cdscope.io import check_plot_path, check_writable
    from cdscope.tasks import default_task_paths, load_tasks

    options = model_options(
        device, dtype, attn, device_map, max_memory, offload_dir, revision, trust_remote_code
    )
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
        from cdscope.output.render_runs import passk_table

        out_console.print(passk_table(result.passk, list(dict.fromkeys(models_or_embedded(model)))))
        out_console.print(stats_table(result.stats))
    if plot is not None:
        wrote(err_console, str(plot))
    wrote(
        err_console,
        f"{out / 'samples.parquet'} ({len(result.samples)} samples) and {out / 'passk.parquet'}",
    )
