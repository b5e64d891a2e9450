"""Rich tables for the terminal. Percent for humans; Parquet keeps fractions (SPEC §3)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.table import Table

from cdscope.spectral import b_shared


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def short_model_name(name: str) -> str:
    """Paths shown by their last component; hub ids and the embedded name as they are."""
    return Path(name).name if ("/" in name and Path(name).exists()) else name


def seed_summary_table(frame: pd.DataFrame) -> Table:
    """Per (model, seed): B_shared(C), B_shared(F) in percent and l_m per family."""
    from cdscope.commands.probe import control_matrices

    table = Table(title="Control per seed: B_shared in %, l_m = mean log-likelihood", title_justify="left")
    families = sorted(frame["family"].unique())
    table.add_column("model", overflow="fold")
    for column in ["seed", "B_shared C", "B_shared F", *[f"l {f}" for f in families]]:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("dropped")
    C, F = control_matrices(frame, "C"), control_matrices(frame, "F")  # noqa: N806
    for (model, seed), group in frame.groupby(["model", "seed"], sort=False):
        ell = group.groupby("family")["ell"].first()
        dropped = sorted(group.loc[group["dropped"], "family"].unique())
        kept_c = C.get((model, int(seed)))
        bc = _pct(b_shared(kept_c[1])) if kept_c and len(kept_c[0]) >= 2 else "n/a"
        bf = _pct(b_shared(F[(model, int(seed))][1])) if kept_c and len(kept_c[0]) >= 2 else "n/a"
        table.add_row(
            short_model_name(str(model)), str(seed), bc, bf,
            *[f"{ell.get(f, float('nan')):.1f}" for f in families], ", ".join(dropped) or "-",
        )
    return table
