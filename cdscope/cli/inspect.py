"""inspect: the discovered residual writes of a model and the proof that gates sit on them."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer

from cdscope.cli.common import app, out_console, user_errors
from cdscope.cli.options import with_settings
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import ModelSettings


@app.command()
@user_errors
@with_settings(ModelSettings, "model_settings", device="cpu")
def inspect(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print the layout as JSON.")] = False,
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Discovered layout per layer (module paths, roles), K, proof, eap-info support."""
    from cdscope.commands.inspect import run_inspect
    from cdscope.core.models.opening import ModelOptions

    if model_settings.places and model_settings.device == "cpu":  # the default gives way
        model_settings = dataclasses.replace(model_settings, device="auto")
    record = run_inspect(model, ModelOptions.from_settings(model_settings))
    if as_json:
        from cdscope.schemas import strict_json

        payload = {"command": "inspect", **record}  # as every --json output begins
        typer.echo(json.dumps(strict_json(payload), indent=2, allow_nan=False))
        return
    from cdscope.output.render_models import layout_notes, layout_table

    out_console.print(layout_table(record))
    for line in layout_notes(record):
        out_console.print(line, highlight=False)
