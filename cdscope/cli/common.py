"""What every command shares: the Typer app, consoles, error handling and option types.

Exit codes: 0 success, 1 a failed audit threshold (``--fail-above``), 2 bad input (one
line on stderr saying what was wrong and how to fix it).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from cdscope.cli.params import COUNT_MAX
from cdscope.errors import AuditFailed, CdscopeError


class _Group(TyperGroup):
    """Reads ``--resume=recompute`` as ``--resume --recompute`` (and ``--resume=keep`` as
    ``--resume``): Typer's options cannot take an optional value."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        spelled = {"--resume=recompute": ["--resume", "--recompute"], "--resume=keep": ["--resume"]}
        return super().parse_args(ctx, [a for arg in args for a in spelled.get(arg, [arg])])


app = typer.Typer(
    cls=_Group,
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
            err_console.print(f"[yellow]interrupted[/yellow]: {after_interrupt}", soft_wrap=True)
            raise typer.Exit(130) from None

    # Only commands with --resume can promise to continue; the others write whole files or none.
    after_interrupt = (
        "finished work is kept; rerun with --resume"
        if "resume" in inspect.signature(func).parameters
        else "every file is written whole or not at all; this command has no --resume, rerun it"
    )

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
    int,
    typer.Option(
        "--seeds", "-s", min=1, max=COUNT_MAX, help="Number of probe seeds S (seeds 0..S-1)."
    ),
]
NOpt = Annotated[
    int, typer.Option("--n", min=1, max=COUNT_MAX, help="Probe samples per family per seed.")
]
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
    typer.Option(
        "--resume",
        help="Keep finished (model, seed) pairs of an interrupted --out whose model content "
        "hash, dtype and settings match; refuse otherwise (--resume=recompute: redo those).",
    ),
]
RecomputeOpt = Annotated[
    bool,
    typer.Option(
        "--recompute",
        help="With --resume (also spelled --resume=recompute): measure again the pairs whose "
        "model or settings changed, instead of refusing.",
    ),
]


def resume_arg(resume: bool, recompute: bool) -> bool | str:
    """The ``resume`` argument of the workflows: False, True ('keep') or 'recompute'."""
    if recompute and not resume:
        raise CdscopeError("--recompute only applies with --resume (spell it --resume=recompute)")
    return "recompute" if recompute else resume


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
        "--seeds",
        "-s",
        min=1,
        max=COUNT_MAX,
        help="Number of probe seeds S (seeds 0..S-1) [default: 3].",
    ),
]
AuditNOpt = Annotated[
    int | None,
    typer.Option(
        "--n", min=1, max=COUNT_MAX, help="Probe samples per family per seed [default: 3]."
    ),
]
AuditTemplateOpt = Annotated[
    str | None,
    typer.Option("--template", "-t", help="Prompt template: plain | chat [default: plain]."),
]
