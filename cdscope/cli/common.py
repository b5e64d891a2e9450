"""What every command shares: the Typer app, consoles, error handling and option types.

Exit codes: 0 success, 1 a failed audit threshold (``--fail-above``), 2 bad input (one
line on stderr saying what was wrong and how to fix it).

A command function's parameters are its options (Typer reads them from its signature), so
a command has as many parameters as options and its signature as many lines: the
8-parameter bound does not apply to it, and its body, not its signature, is kept short.
Options that are settings come from ``cdscope.settings`` through ``cdscope.cli.options``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from cdscope.cli.params import COUNT_MAX
from cdscope.errors import AuditFailed, CdscopeError
from cdscope.messages import make_console, say, warn
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings.names import SEEDS_HELP

_ARGV = "cdscope.argv"  # ctx.meta key: the arguments as typed (after the root options)


def _base(name: str) -> type[Exception]:
    """Click's exception class ``name`` as this Typer uses it (its own copy of click in
    Typer >= 0.25, click itself before): found on the MRO of the public BadParameter."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


ClickException, UsageError = _base("ClickException"), _base("UsageError")


class UsageLine(UsageError):  # type: ignore[misc,valid-type]
    """A usage error (a value Click/Typer rejected, an unknown option or command) shown as
    cdscope's one ``error:`` line with the value as typed; exit 2. Under a launcher only
    rank 0 prints it (every rank parses the same command line)."""

    def show(self, file: object = None) -> None:
        from cdscope.distributed import is_main_process

        if not is_main_process():
            return
        quiet, err_console.quiet = err_console.quiet, False
        say(err_console, ("error:", "bold red"), " ", self.message)
        err_console.quiet = quiet


def typed_value(args: list[str], param: object) -> str | None:
    """The value given for ``param`` on the command line (the last one, as Click takes
    it): ``--seeds 0``, ``--seeds=0`` and ``-s0`` all give ``'0'``."""
    found = None
    names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif name.startswith("--") and arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
            elif not name.startswith("--") and arg.startswith(name) and len(arg) > len(name):
                found = arg[len(name) :]
    return found


def usage_line(exc: Exception, args: list[str]) -> UsageLine:
    """``exc`` as one line: the option, the value as typed and Click's reason, then where
    the options are listed (``cdscope probe --help``)."""
    ctx = getattr(exc, "ctx", None)
    command = args[0] if args and not args[0].startswith("-") else ""
    path = ctx.command_path if ctx is not None else f"cdscope {command}".strip()
    see = f"see '{path} --help'"
    param = getattr(exc, "param", None)
    if isinstance(exc, typer.BadParameter) and type(exc).__name__ != "MissingParameter" and param:
        name = max(param.opts, key=len) if param.opts else param.human_readable_name
        value = typed_value(args, param)
        reason = exc.message[:1].lower() + exc.message[1:] if exc.message else "invalid value"
        shown = f"{name} {value!r}" if value is not None else name
        return UsageLine(f"{shown}: {reason.rstrip('.')}; {see}", ctx)
    text = exc.format_message().strip()
    return UsageLine(f"{text[:1].lower() + text[1:]}".rstrip(".") + f"; {see}", ctx)


class _Group(TyperGroup):
    """Reads ``--resume=recompute`` as ``--resume --recompute`` (and ``--resume=keep`` as
    ``--resume``): Typer's options cannot take an optional value. Every usage error of
    the root or a command becomes one ``UsageLine``."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        spelled = {"--resume=recompute": ["--resume", "--recompute"], "--resume=keep": ["--resume"]}
        args = [a for arg in args for a in spelled.get(arg, [arg])]
        ctx.meta[_ARGV] = list(args)
        try:
            return super().parse_args(ctx, args)
        except ClickException as exc:
            raise _one_line(exc, args) from None

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except ClickException as exc:
            raise _one_line(exc, ctx.meta.get(_ARGV, [])) from None


def _one_line(exc: Exception, args: list[str]) -> Exception:
    """``usage_line(exc)``, except for what is already one line and the help that a bare
    ``cdscope`` prints (Click's NoArgsIsHelpError)."""
    if isinstance(exc, UsageLine) or type(exc).__name__ == "NoArgsIsHelpError":
        return exc
    return usage_line(exc, args)


app = typer.Typer(
    cls=_Group,
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
        from cdscope.distributed import WorkerDone, is_main_process

        _quiet_libraries()
        main = is_main_process()  # under torchrun / accelerate launch only rank 0 talks
        if not main:
            out_console.quiet = err_console.quiet = True
        try:
            check_inputs(kwargs)  # before the command imports torch: a typo costs no minute
            with contextlib.nullcontext() if main else contextlib.redirect_stdout(io.StringIO()):
                return func(*args, **kwargs)
        except WorkerDone:  # a rank > 0 whose share is gathered: rank 0 writes and reports
            raise typer.Exit(0) from None
        except (CdscopeError, AuditFailed) as exc:
            err_console.quiet = not main  # --quiet silences progress and notes, never a failure
            label = "error:" if isinstance(exc, CdscopeError) else "audit failed:"
            say(err_console, (label, "bold red"), " ", str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.quiet = not main
            warn(err_console, after_interrupt, "interrupted:")
            raise typer.Exit(130) from None

    # Only commands with --resume can promise to continue; the others write whole files or none.
    after_interrupt = (
        "finished work is kept; rerun with --resume"
        if "resume" in inspect.signature(func).parameters
        else "every file is written whole or not at all; this command has no --resume, rerun it"
    )

    return wrapper  # type: ignore[return-value]


#: options naming input files, by parameter name: what their readers call them when the
#: file is missing (core.probes, tasks.io.format, io.read_parquet, commands.evaluate)
INPUT_FILES = {
    "probe": "probe file", "audit_probe": "probe file", "tasks": "task file",
    "audit_train": "task file", "from_path": "file", "hard": "--hard file",
}  # fmt: skip


def check_inputs(values: dict[str, Any]) -> None:
    """The cheap checks of a command's inputs, before its body imports the model stack
    (torch and transformers take seconds to import, a misspelled path should not):
    every ``--model`` / ``--baseline`` (``core.models.hub.check_model_spec``: paths,
    directories, GGUF files, hub-id spelling; not with ``eval --endpoint``, whose server
    names its models) and every input file named in ``INPUT_FILES`` must exist. Only what the readers would refuse anyway is refused here; the readers
    still check the contents."""
    from cdscope.core.models.hub import check_model_spec

    models = () if values.get("endpoint") else ("model", "baseline")  # a server names its own
    for key in models:
        given = values.get(key)
        for spec in [given] if isinstance(given, str | Path) else given or []:
            check_model_spec(str(spec))
    for key, what in INPUT_FILES.items():
        given = values.get(key)
        for path in [given] if isinstance(given, str | Path) else given or []:
            text = str(path)  # a task source may end in ?MAPPING (tasks.io.readers.split_source)
            if not (Path(text).exists() or Path(text.partition("?")[0]).exists()):
                raise CdscopeError(f"{what} not found: {text}")


def _quiet_libraries() -> None:
    """Keep library chatter (weight-loading bars, advisory warnings) off the terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # hub retries and notices: --verbose
    os.environ.setdefault("TQDM_DISABLE", "1")  # library bars (GGUF dequantising): --verbose
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# -- shared options ------------------------------------------------------------------
ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help=f"Model: hub id, local directory, .gguf file, or '{EMBEDDED_NAME}' (embedded default). "
        "Repeat to compare models (the first is the reference).",
    ),
]
SeedsOpt = Annotated[
    int,
    typer.Option("--seeds", "-s", min=1, max=COUNT_MAX, help=SEEDS_HELP),
]
ProbeOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--probe",
        "-p",
        help="Probe pool JSONL file(s) (default: the shipped math/code/logic pools).",
    ),
]


def tasks_option(what: str, split: str) -> Any:
    """``--tasks``: ``what`` file(s) (``Task`` / ``Training task``), the shipped ``split``
    sets by default (eval and train)."""
    return Annotated[
        list[Path] | None,
        typer.Option(
            "--tasks",
            help=f"{what} file(s): JSONL, Parquet or a datasets save_to_disk folder, in "
            "cdscope's format or GSM8K / MATH / HumanEval / MBPP columns (default: the shipped "
            f"{split} sets).",
        ),
    ]


TaskColumnsOpt = Annotated[
    str | None,
    typer.Option(
        "--task-columns",
        help="Column mapping for --tasks in other schemas: a schema (gsm8k, math, humaneval, "
        "mbpp) and/or field=column items, e.g. 'prompt=q,answer=a,verifier=math' (docs/tasks.md).",
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
        from cdscope.version import __version__

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
        say(err_console, ("error:", "bold red"), " --quiet and --verbose exclude each other")
        raise typer.Exit(2)
    err_console.quiet = quiet
    if verbose:  # before _quiet_libraries' setdefaults, which then keep these
        os.environ["TRANSFORMERS_VERBOSITY"] = "info"
        os.environ["HF_HUB_VERBOSITY"] = "info"
        os.environ.setdefault("TQDM_DISABLE", "")  # empty: tqdm's bars on (unless the user said)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"


def refuse_with_from(changed: dict[str, object]) -> None:
    """``--from`` reads numbers measured earlier (their model, device and dtype are in that
    file): an option about loading or measuring a model would be silently ignored, so
    each one given (``changed``: option name -> its value, or True to name the option
    alone) is refused by name, as typed."""
    named = [
        f"--{key.replace('_', '-')}" + ("" if isinstance(value, bool) else f" {value}")
        for key, value in changed.items()
        if value not in (None, [], ())
    ]
    if named:
        raise CdscopeError(
            f"{', '.join(named)} does not apply to --from, which reads measurements made "
            "earlier (their model, device and dtype are in that file): drop it, or measure "
            "again without --from"
        )


def models_or_embedded(model: list[str] | None) -> list[str]:
    """The --model values, or the embedded default model when none is given."""
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


def print_json(command: str, tables: dict[str, object], **extra: object) -> None:
    """``--json``: one strict JSON object on stdout (RFC 8259: what ``JSON.parse``, ``jq``
    and every strict parser accept); each DataFrame becomes a list of row records.

    Non-finite numbers (NaN, ±inf: a standard error from one seed, a measure that is
    undefined for a run) are written as ``null``, as are pandas' missing values; numpy
    scalars and arrays become numbers and lists, anything else its ``str``
    (``cdscope.schemas.strict_json``)."""
    import json

    from cdscope.schemas import strict_json

    payload: dict[str, object] = {"command": command}
    for name, table in tables.items():
        to_dict = getattr(table, "to_dict", None)
        payload[name] = to_dict(orient="records") if to_dict else table
    payload.update(extra)
    typer.echo(json.dumps(strict_json(payload), allow_nan=False))
