"""Tables about models for the terminal: the discovered and proven layout of ``inspect``
(one row per residual write) and the models ``cdscope models`` installs."""

from __future__ import annotations

from rich.table import Table

from cdscope.messages import VerbatimTable
from cdscope.settings.names import SUBLAYER


def layout_table(record: dict) -> Table:
    """``inspect``'s record (``commands.inspect.describe``) as one row per write: layer,
    gate, role, module, what it reads, its EAP paths and notes (post-norm, scale)."""
    table = VerbatimTable(title=f"{record['model']} ({record['model_type']}): K = {record['K']}")
    for column in ("layer", "gate", "role", "module (gate site)", "reads", "eap paths", "notes"):
        table.add_column(column)
    for layer in record["layers"]:
        for w in layer["writes"]:
            notes = []
            if w["post_norm"]:
                notes.append(f"post-norm of {w[SUBLAYER].rsplit('.', 1)[-1]}")
            if w["scale"] != 1.0:
                notes.append(f"scale {w['scale']:.4g}")
            if w["streams"]:
                notes.append(w["streams"])
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
    return table


#: what zero gates leave, by the proof's ``carry`` (``cdscope.core.models.proof``)
_ZERO = {
    "identity": "the stream unchanged",
    "mixed": "each step's mixed carry (the streams mixed, never written)",
}


def layout_notes(record: dict) -> list[str]:
    """The lines under ``layout_table``: the proof, where the logits come from (when not
    from the head alone), second-order support, eap-info support."""
    proof = record["proof"]
    lines = [
        f"proof on {proof['tokens']} tokens ({proof['dtype']}): unit gates exact; "
        f"write sums within {proof['write_sum_error']:.1e} (tolerance "
        f"{proof['write_sum_tolerance']:.1e}); zero gates leave {_ZERO[proof['carry']]}; "
        f"causal (earlier logits moved {proof['causal_error']:.1e}); "
        f"{proof['discovery_and_proof_s']:.2f} s",
    ]
    if not proof["own_head"]:
        lines.append("logits: through the model's own forward (it transforms them after its head)")
    return [*lines, f"second order: {record['second_order']}", f"eap-info: {record['eap_info']}"]


def installed_models_table(row: dict) -> Table:
    """``models list``: the embedded model's name, GGUF, where it came from, its cache."""
    table = VerbatimTable(title="models cdscope installs", title_justify="left")
    for column in ("name", "GGUF", "from", "dequantised cache"):
        table.add_column(column, overflow="fold")  # paths are shown whole
    cache = row["cache"] if row["dequantised"] else "not yet built"
    table.add_row(row["name"], row["gguf"] or "-", row["source"], cache)
    return table
