"""What every command shares: the Typer app, consoles, error handling and option types.

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
            return _loud_on_failure(func)(*args, **kwargs)
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


def _loud_on_failure(func: F) -> F:
    """``--quiet`` silences progress and notes, never the reason a command failed."""

    @functools.wraps(func)
    def inner(*args: object, **kwargs: object) -> object:
        try:
            return func(*args, **kwargs)
        except BaseException:
            err_console.quiet = False
            raise

    return inner  # type: ignore[return-value]


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
DeviceOpt = Annotated[
    str, typer.Option("--device", help="auto (CUDA if available, else CPU) | cpu | cuda[:N] | mps.")
]
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
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress bars or notes on stderr (errors still print)."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Let transformers/hub logs and download bars through."
        ),
    ] = False,
) -> None:
    """Gated sublayer control diagnostics for RL post-training of language models.

    Every command reads models (hub id, local directory, .gguf, or the embedded
    default smollm2-135m) and the shipped probe pools, and writes Parquet that loads in
    pandas. Exit codes: 0 ok, 1 failed audit threshold, 2 bad input.
    """
    if quiet and verbose:
        err_console.print("[bold red]error:[/bold red] --quiet and --verbose exclude each other")
        raise typer.Exit(2)
    err_console.quiet = quiet
    if verbose:  # before _quiet_libraries' setdefaults, which then keep these
        os.environ["TRANSFORMERS_VERBOSITY"] = "info"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"


def _models(model: list[str] | None) -> list[str]:
    from cdscope.models import EMBEDDED_NAME

    return model or [EMBEDDED_NAME]


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
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision",
        help="Hub branch, tag or commit of every --model that is a hub id (the commit hash "
        "loaded is recorded in the output metadata).",
    ),
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Allow a hub repository or model directory to run its own modelling code.",
    ),
]


def print_json(command: str, tables: dict[str, object], **extra: object) -> None:
    """``--json``: one JSON object on stdout; each DataFrame becomes a list of row records."""
    import json

    payload: dict[str, object] = {"command": command}
    for name, table in tables.items():
        to_dict = getattr(table, "to_dict", None)
        payload[name] = to_dict(orient="records") if to_dict else table
    payload.update(extra)
    typer.echo(json.dumps(payload, default=_jsonable, allow_nan=True))


def _jsonable(value: object) -> object:
    """numpy scalars and arrays, paths, timestamps: as JSON numbers, lists and strings."""
    for method in ("item", "tolist"):
        if hasattr(value, method):
            return getattr(value, method)()
    return str(value)
