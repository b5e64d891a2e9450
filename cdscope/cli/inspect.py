"""inspect: the discovered residual writes of a model and the proof that gates sit on them."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cdscope.cli.common import AttnOpt, DeviceOpt, DtypeOpt, app, out_console, user_errors
from cdscope.messages import VerbatimTable
from cdscope.resources import EMBEDDED_NAME


@app.command()
@user_errors
def inspect(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print the layout as JSON.")] = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow the checkpoint's own modeling code.")
    ] = False,
) -> None:
    """Discovered layout per layer (module paths, roles), K, proof, eap-info support."""
    from cdscope.commands.inspect import run_inspect

    record = run_inspect(model, device, dtype, attn, trust_remote_code)
    if as_json:
        from cdscope.schemas import strict_json

        typer.echo(json.dumps(strict_json(record), indent=2, allow_nan=False))
        return
    table = VerbatimTable(title=f"{record['model']} ({record['model_type']}): K = {record['K']}")
    for column in ("layer", "gate", "role", "module (gate site)", "reads", "eap paths", "notes"):
        table.add_column(column)
    for layer in record["layers"]:
        for w in layer["writes"]:
            notes = []
            if w["post_norm"]:
                notes.append(f"post-norm of {w['sublayer'].rsplit('.', 1)[-1]}")
            if w["scale"] != 1.0:
                notes.append(f"scale {w['scale']:.4g}")
            reads = "block input (parallel)" if w["parallel"] else "stream"
            table.add_row(
                str(layer["layer"]),
                str(w["gate"]),
                w["role"],
                w["module"],
                reads,
                "/".join(w["eap_paths"]) or "-",
                ", ".join(notes),
            )
    out_console.print(table)
    proof = record["proof"]
    out_console.print(
        f"proof on {proof['tokens']} tokens ({proof['dtype']}): unit gates exact; "
        f"write sums within {proof['write_sum_error']:.1e} (tolerance "
        f"{proof['write_sum_tolerance']:.1e}); zero gates leave the stream unchanged; "
        f"{proof['discovery_and_proof_s']:.2f} s",
        highlight=False,
    )
    if not proof["own_head"]:
        out_console.print(
            "logits: through the model's own forward (it transforms them after its head)",
            highlight=False,
        )
    out_console.print(f"second order: {record['second_order']}", highlight=False)
    out_console.print(f"eap-info: {record['eap_info']}", highlight=False)
