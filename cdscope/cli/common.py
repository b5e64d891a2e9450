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

from cdscope.errors import AuditFailed, CdscopeError
from cdscope.messages import make_console, say, warn

app = typer.Typer(
    name="cdscope",
    help="Gated sublayer control diagnostics for RL post-training of language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help text is shown as written: rich markup would eat "[default: 3]", "cdscope[trl]".
    rich_markup_mode=None,
)
# Piped or redirected output (CI logs, files) gets wide tables instead of 80-column wraps.
# Both print text verbatim (cdscope/messages.py): user paths and ids may hold "[...]".
out_console = make_console(stderr=False, width=None if sys.stdout.isatty() else 160)
err_console = make_console()

F = TypeVar("F", bound=Callable[..., object])


def user_errors(func: F) -> F:
    """Turn CdscopeError / AuditFailed into one red line (verbatim) and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        _quiet_libraries()
        try:
            return func(*args, **kwargs)
        except (CdscopeError, AuditFailed) as exc:
            label = "error:" if isinstance(exc, CdscopeError) else "audit failed:"
            say(err_console, (label, "bold red"), " ", str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            warn(err_console, "finished seeds are kept; rerun with --resume", "interrupted:")
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

        say(out_console, f"cdscope {__version__}")
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
