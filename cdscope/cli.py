"""The ``cdscope`` command line (Typer). Thin: parse, call one workflow, render.

Exit codes: 0 success, 1 a failed audit threshold (``--fail-above``), 2 bad input (one
line on stderr saying what was wrong and how to fix it).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from cdscope.errors import AuditFailed, CdscopeError

app = typer.Typer(
    name="cdscope",
    help="Gated sublayer control diagnostics for RL post-training of language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
# Piped or redirected output (CI logs, files) gets wide tables instead of 80-column wraps.
out_console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., object])


def user_errors(func: F) -> F:
    """Turn CdscopeError / AuditFailed into one red line and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        _quiet_libraries()
        try:
            return func(*args, **kwargs)
        except CdscopeError as exc:
            err_console.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except AuditFailed as exc:
            err_console.print(
                f"[bold red]audit failed:[/bold red] {exc}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print(
                "[yellow]interrupted[/yellow]: finished seeds are kept; rerun with --resume"
            )
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _quiet_libraries() -> None:
    """Keep library chatter (weight-loading bars, advisory warnings) off the terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# -- shared options ------------------------------------------------------------------
ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help="Model: hub id, local directory, .gguf file, or 'smollm2-135m' (embedded default). "
        "Repeat to compare models (the first is the reference).",
    ),
]
SeedsOpt = Annotated[
    int, typer.Option("--seeds", "-s", min=1, help="Number of probe seeds S (seeds 0..S-1).")
]
NOpt = Annotated[int, typer.Option("--n", min=1, help="Probe samples per family per seed.")]
ProbeOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--probe",
        "-p",
        help="Probe pool JSONL file(s) (default: the shipped math/code/logic pools).",
    ),
]
TemplateOpt = Annotated[
    str, typer.Option("--template", "-t", help="Prompt template: plain | chat.")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float64."
    ),
]
AttnOpt = Annotated[
    str, typer.Option("--attn", help="Attention kernel: auto | eager | sdpa | flash_attention_2.")
]
BatchOpt = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        min=1,
        help="Rows per forward (memory bound); default: 1 on CPU (no padding), the whole probe on GPU.",
    ),
]
ResumeOpt = Annotated[
    bool,
    typer.Option("--resume", help="Keep finished (model, seed) pairs of an interrupted --out."),
]


def _version(value: bool) -> None:
    if value:
        from cdscope import __version__

        out_console.print(f"cdscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Gated sublayer control diagnostics for RL post-training of language models.

    Every command reads models (hub id, local directory, .gguf, or the embedded
    default smollm2-135m) and the shipped probe pools, and writes Parquet that loads in
    pandas. Exit codes: 0 ok, 1 failed audit threshold, 2 bad input.
    """


def _models(model: list[str] | None) -> list[str]:
    from cdscope.models import EMBEDDED_NAME

    return model or [EMBEDDED_NAME]


@app.command()
@user_errors
def probe(
    model: ModelOpt = None,
    seeds: SeedsOpt = 1,
    n: NOpt = 3,
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/probe.parquet"
    ),
    estimator: Annotated[
        str,
        typer.Option(
            "--estimator", help="autograd (one backward) | fd (2K gated forwards, slow check)."
        ),
    ] = "autograd",
    fd_step: Annotated[
        float, typer.Option("--fd-step", help="Gate step h of the fd estimator.")
    ] = 1e-2,
    fd_order: Annotated[
        int,
        typer.Option(
            "--fd-order", help="fd stencil: 2 (2K passes, O(h^2)) or 4 (4K passes, O(h^4))."
        ),
    ] = 2,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    resume: ResumeOpt = False,
) -> None:
    """Measure the control matrix C, activation matrix F and l_m per family (SPEC §2).

    Writes one row per (model, seed, family, gate) with columns layer, sublayer, C, F,
    dl_dg, ell, dropped; run metadata is in the Parquet key-value metadata.
    """
    from cdscope.commands.probe import collect_control
    from cdscope.frames import ModelOptions, ProbeSettings
    from cdscope.io import check_writable
    from cdscope.probes import load_pool
    from cdscope.render import seed_summary_table

    settings = ProbeSettings(
        tuple(range(seeds)), n, template, estimator, batch_size, fd_step, fd_order
    )
    target = check_writable(out)
    pool = load_pool(probe)
    frame, _ = collect_control(
        _models(model),
        pool,
        settings,
        target,
        ModelOptions(device, dtype, attn),
        resume,
        err_console,
    )
    out_console.print(seed_summary_table(frame))
    err_console.print(f"[green]wrote[/green] {target} ({len(frame)} rows)", soft_wrap=True)


PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write a figure (.png, .pdf or .svg).")
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one machine-readable JSON summary on stdout (fractions)."),
]
FromOpt = Annotated[
    Path | None,
    typer.Option(
        "--from",
        help="Recompute from an existing probe Parquet (OUT.probe.parquet) without loading a model.",
    ),
]
AuditSeedsOpt = Annotated[
    int | None,
    typer.Option(
        "--seeds", "-s", min=1, help="Number of probe seeds S (seeds 0..S-1) [default: 3]."
    ),
]
AuditNOpt = Annotated[
    int | None, typer.Option("--n", min=1, help="Probe samples per family per seed [default: 3].")
]
AuditTemplateOpt = Annotated[
    str | None,
    typer.Option("--template", "-t", help="Prompt template: plain | chat [default: plain]."),
]


def _run_audit_command(
    command: str,
    model: list[str] | None,
    seeds: int | None,
    n: int | None,
    probe: list[Path] | None,
    template: str | None,
    out: Path,
    plot: Path | None,
    as_json: bool,
    from_path: Path | None,
    resume: bool,
    batch_size: int | None,
    device: str,
    dtype: str,
    attn: str,
):
    """Shared body of bshared / acg / decompose: measure or read, summarise, write, render."""
    from cdscope.commands.audit import AUDITS, run_audit, sibling
    from cdscope.frames import ModelOptions, ProbeSettings
    from cdscope.io import check_plot_path, check_writable

    spec = AUDITS[command]
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    if from_path is not None and resume:
        raise CdscopeError("--resume continues a measurement; it does not apply to --from")
    settings = ProbeSettings(
        tuple(range(seeds or 3)), n or 3, template or "plain", "autograd", batch_size
    )
    explicit = {"n": n, "template": template}
    result = run_audit(
        spec,
        target,
        _models(model) if from_path is None else model,
        from_path,
        settings,
        probe,
        ModelOptions(device, dtype, attn),
        resume,
        err_console,
        explicit,
    )
    if result.per_seed.empty:
        raise CdscopeError(
            "no (model, seed) had at least 2 families with |l_m| >= 1e-4; nothing to report"
        )
    outputs = {"per_seed": str(target), "summary": str(sibling(target, "summary"))}
    if from_path is None:
        outputs["probe"] = str(sibling(target, "probe"))
    if plot is not None:
        outputs["plot"] = str(plot)
    return spec, result, outputs


def _report(
    command: str, spec, result, outputs: dict, as_json: bool, extra: dict | None = None
) -> None:  # noqa: ANN001
    import json

    from cdscope.render import audit_table, per_seed_table

    if as_json:
        payload = {
            "command": command,
            "models": list(dict.fromkeys(result.per_seed["model"])),
            "summary": result.summary.to_dict(orient="records"),
            "paired": result.paired.to_dict(orient="records"),
            "per_seed": result.per_seed.to_dict(orient="records"),
            "refused_pairs": result.skipped_pairs,
            "outputs": outputs,
            **(extra or {}),
        }
        typer.echo(json.dumps(payload, default=float, allow_nan=True))
    else:
        out_console.print(
            per_seed_table(result.per_seed, spec.headline, f"{spec.headline} per seed (%)")
        )
        out_console.print(
            audit_table(result.summary, result.paired, f"cdscope {command}: mean ± SE over seeds")
        )
    for name, path in outputs.items():
        err_console.print(f"[green]wrote[/green] {name}: {path}", soft_wrap=True)


@app.command()
@user_errors
def bshared(
    model: ModelOpt = None,
    seeds: AuditSeedsOpt = None,
    n: AuditNOpt = None,
    probe: ProbeOpt = None,
    template: AuditTemplateOpt = None,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
    ] = Path("results/bshared.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            help="CI gate: exit 1 if a model's mean B_shared(C) exceeds PCT percent.",
        ),
    ] = None,
    from_path: FromOpt = None,
    resume: ResumeOpt = False,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
) -> None:
    """Shared control bottleneck B_shared(C) = lambda_1 / tr(C C^T) per model and seed (SPEC §3).

    Reports mean ± SE over seeds (in %), R(C), and with several models the same-seed
    paired differences against the first model (mean ± SE, negatives, 95% t-interval).
    """
    from cdscope.errors import AuditFailed

    spec, result, outputs = _run_audit_command(
        "bshared",
        model,
        seeds,
        n,
        probe,
        template,
        out,
        plot,
        as_json,
        from_path,
        resume,
        batch_size,
        device,
        dtype,
        attn,
    )
    if plot is not None:
        _draw_audit("bshared", plot, result)
    failed = []
    if fail_above is not None:
        means = result.summary[result.summary["measure"] == "B_shared_C"]
        failed = [
            f"{r.model} {100 * r.mean:.1f}%"
            for r in means.itertuples()
            if 100 * r.mean > fail_above
        ]
    _report("bshared", spec, result, outputs, as_json, {"fail_above": fail_above, "failed": failed})
    if failed:
        raise AuditFailed(f"mean B_shared(C) above {fail_above}%: {', '.join(failed)}")


def _draw_audit(command: str, plot: Path, result) -> None:  # noqa: ANN001
    """The figure of each audit command."""
    from cdscope.plots import plot_audit, plot_decompose

    if command == "decompose":
        plot_decompose(plot, result.per_seed, result.summary)
        return
    measures, title = {
        "bshared": (["B_shared_C"], "B_shared(C)"),
        "acg": (["B_shared_F", "B_shared_C", "ACG"], "Activation vs control"),
    }[command]
    plot_audit(plot, title, result.per_seed, result.summary, result.paired, measures)


def _register_audit_command(command: str, doc: str) -> None:
    """acg and decompose share bshared's options (without the CI gate): one definition."""

    def audit_command(
        model: ModelOpt = None,
        seeds: AuditSeedsOpt = None,
        n: AuditNOpt = None,
        probe: ProbeOpt = None,
        template: AuditTemplateOpt = None,
        out: Annotated[
            Path,
            typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
        ] = Path(f"results/{command}.parquet"),
        plot: PlotOpt = None,
        as_json: JsonOpt = False,
        from_path: FromOpt = None,
        resume: ResumeOpt = False,
        batch_size: BatchOpt = None,
        device: DeviceOpt = "auto",
        dtype: DtypeOpt = "auto",
        attn: AttnOpt = "auto",
    ) -> None:
        spec, result, outputs = _run_audit_command(
            command, model, seeds, n, probe, template, out, plot, as_json, from_path, resume,
            batch_size, device, dtype, attn,
        )  # fmt: skip
        if plot is not None:
            _draw_audit(command, plot, result)
        _report(command, spec, result, outputs, as_json)

    audit_command.__doc__ = doc
    audit_command.__name__ = command
    app.command(command)(user_errors(audit_command))


_register_audit_command(
    "acg",
    """Activation-control gap ACG = B_shared(F) - B_shared(C) per model and seed (SPEC §3).

    F measures how strongly each sublayer is used, C how strongly it controls the
    likelihood of verified answers; ACG > 0 means usage is more shared than control.
    """,
)
_register_audit_command(
    "decompose",
    """Decompose B_shared: direction sharing B_dir, row-norm share B_norm, |cos|, PR (SPEC §3).

    Per model and seed: B_dir (B_shared of the row-normalised C), B_norm (largest share of
    squared row norms), |cos| of every family pair and each family's participation ratio.
    Paired deltas of PR (a K-dependent count) are refused between models with different K.
    """,
)


@app.command("random-ref")
@user_errors
def random_ref(
    families: Annotated[
        int, typer.Option("--families", "-M", help="Number of families M (rows).")
    ] = 3,
    gates: Annotated[
        int | None,
        typer.Option("--gates", "-K", help="Number of gates K (columns); default: K of --model."),
    ] = None,
    trials: Annotated[
        int, typer.Option("--trials", "-T", help="Number of random matrices T.")
    ] = 50_000,
    seed: Annotated[int, typer.Option("--seed", help="RNG seed.")] = 0,
    value: Annotated[
        float | None,
        typer.Option("--value", help="A measured B_shared in percent: report its percentile."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Take K from this model (2 x layers).")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Parquet of the T samples (stats in metadata).")
    ] = Path("results/random_ref.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Distribution of B_shared for M x K matrices with i.i.d. Gaussian rows (SPEC §4).

    The 1/M lower bound is not what a random matrix gives: compare a measured value
    with this reference (mean, std, p95, p99, and the value's percentile).
    """
    import json

    import pandas as pd

    from cdscope.io import check_plot_path, check_writable, run_metadata, write_parquet
    from cdscope.render import random_ref_table
    from cdscope.spectral import random_reference

    if families < 2:
        raise CdscopeError(
            f"--families must be at least 2 (B_shared of one row is always 1); got {families}"
        )
    if trials < 1:
        raise CdscopeError(f"--trials must be at least 1; got {trials}")
    if value is not None and not 0 < value <= 100:
        raise CdscopeError(f"--value is a percentage in (0, 100]; got {value}")
    if gates is None:
        if model is None:
            raise CdscopeError("give --gates K, or --model to take K from a model")
        from cdscope.models.loading import model_gate_count

        gates = model_gate_count(model)
    if gates < 1:
        raise CdscopeError(f"--gates must be at least 1; got {gates}")
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    ref = random_reference(families, gates, trials, seed)
    fraction = None if value is None else value / 100
    percentile = None if fraction is None else ref.percentile_of(fraction)
    stats = {
        "M": families,
        "K": gates,
        "trials": trials,
        "seed": seed,
        "mean": ref.mean,
        "std": ref.std,
        "p95": ref.p95,
        "p99": ref.p99,
        "value": fraction,
        "percentile": percentile,
        "model": model,
    }
    write_parquet(
        pd.DataFrame({"trial": range(trials), "B_shared": ref.samples}),
        target,
        run_metadata("random-ref", **stats),
    )
    if plot is not None:
        from cdscope.plots import plot_random_reference

        plot_random_reference(
            plot, ref.samples, families, gates, ref.p95, ref.p99, fraction, percentile
        )
    if as_json:
        typer.echo(json.dumps(stats))
    else:
        out_console.print(random_ref_table(stats))
    err_console.print(
        f"[green]wrote[/green] {target}" + (f" and {plot}" if plot else ""), soft_wrap=True
    )


@app.command("eap-info")
@user_errors
def eap_info(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model (default: the embedded smollm2-135m).")
    ] = "smollm2-135m",
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="Base model to compare with: same architecture and layer count; only samples both answer correctly are used.",
        ),
    ] = None,
    family: Annotated[
        str,
        typer.Option("--family", "-f", help="Probe family whose prompts are answered and scored."),
    ] = "math",
    n: Annotated[
        int, typer.Option("--n", min=1, help="Samples drawn from the family (seeded, SPEC §4).")
    ] = 5,
    seed: Annotated[
        int, typer.Option("--seed", help="Probe draw seed; also seeds the bootstrap.")
    ] = 0,
    probe: ProbeOpt = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Per-sample Parquet; the mean edge matrix goes to OUT.edges.parquet.",
        ),
    ] = Path("results/eap.parquet"),
    plot: PlotOpt = None,
    use_targets: Annotated[
        bool,
        typer.Option(
            "--use-targets",
            help="Score the probe targets instead of the model's verified answers (answer_source = probe_target).",
        ),
    ] = False,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens", min=1, help="Skip (and count) samples whose prompt + answer is longer."
        ),
    ] = 512,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="Greedy generation bound per answer.")
    ] = 256,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
) -> None:
    """Edge attribution statistics of verified answers: intensity, information complexity, kurtosis (SPEC §6).

    Zero-ablation EAP on a layer-level graph (emb, attn/mlp per layer with q/k/v paths,
    logits; 4L^2 + 3L + 1 edges), one forward + one backward per batch; Loss = mean NLL
    of the answer tokens. Reports means with bootstrap 95% intervals (B = 2000) and, with
    --baseline, paired differences model - baseline.
    """
    from cdscope.commands.eap_info import EapSettings, run_eap_info, write_eap_outputs
    from cdscope.commands.probe import ModelOptions
    from cdscope.io import check_plot_path, check_writable
    from cdscope.probes import load_pool
    from cdscope.render import eap_summary_table

    settings = EapSettings(family, n, seed, use_targets, max_tokens, max_new_tokens, batch_size)
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    result = run_eap_info(
        model, baseline, load_pool(probe), settings, ModelOptions(device, dtype, attn), err_console
    )
    if plot is not None:  # first: a failing figure leaves no Parquet behind
        from cdscope.plots import plot_eap

        plot_eap(plot, result.graph, result.edges, result.per_sample, result.summary)
    outputs = write_eap_outputs(result, target) | ({"plot": plot} if plot is not None else {})
    out_console.print(eap_summary_table(result.summary, result.paired, result.metadata["counts"]))
    for name, path in outputs.items():
        err_console.print(f"[green]wrote[/green] {name}: {path}", soft_wrap=True)


def _eps_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CdscopeError(
            f"--eps takes comma-separated numbers like 0.05,0.01; got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise CdscopeError(f"--eps values must be positive; got {text!r}")
    return values


@app.command()
@user_errors
def gradcheck(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model (default: the embedded smollm2-135m).")
    ] = "smollm2-135m",
    seeds: SeedsOpt = 3,
    n: NOpt = 3,
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    eps: Annotated[
        str, typer.Option("--eps", help="Comma-separated gate steps to sweep.")
    ] = "0.05,0.02,0.01,0.005,0.002,0.001",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/gradcheck.parquet"
    ),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: Annotated[
        str, typer.Option("--attn", help="Attention kernel; the exact gradient needs eager.")
    ] = "eager",
    richardson_sweep: Annotated[
        bool, typer.Option("--richardson-sweep", help="Also sweep the Richardson proxy over every --eps.")
    ] = False,
) -> None:
    """Fidelity of the first-order CD-RFT gradients against the exact one (SPEC §5).

    Per seed: the exact d R(C(theta))/d theta by double backward, then the fixed-step
    proxy at each --eps (and the Richardson proxy too with --richardson-sweep), and the
    default estimator (Richardson, eps 0.01); cosine and
    relative L2 error against the exact gradient, with wall time of each.
    """
    from cdscope.commands.gradcheck import run_gradcheck
    from cdscope.io import check_writable
    from cdscope.probes import load_pool
    from cdscope.render import gradcheck_table

    eps_values = _eps_list(eps)
    target = check_writable(out)
    pool = load_pool(probe)
    frame = run_gradcheck(
        model,
        pool,
        tuple(range(seeds)),
        n,
        template,
        eps_values,
        target,
        device,
        dtype,
        attn,
        err_console,
        richardson_sweep,
    )
    out_console.print(gradcheck_table(frame))
    err_console.print(f"[green]wrote[/green] {target}", soft_wrap=True)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # python -m cdscope.cli
    main()
