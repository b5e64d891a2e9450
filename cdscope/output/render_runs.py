"""Tables of training and evaluation runs (the terminal's, and the report's through
``html.rich_table``): pass@k per scope and k (SPEC §7), eval's generation and
verification statistics, and one row per training step."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from cdscope.messages import VerbatimTable
from cdscope.output.render import short_model_name


def passk_table(passk: pd.DataFrame, models: list[str] | None = None) -> Table:
    """One row per (scope, model): each domain's benchmarks, then the domain mean, then
    overall (and the same for the hard subset); one column per k, in percent."""
    models = models or list(dict.fromkeys(passk["model"]))
    ks = sorted(passk["k"].unique())
    table = VerbatimTable(title="pass@k (%, unbiased estimator)", title_justify="left")
    table.add_column("scope", no_wrap=True)
    if len(models) > 1:
        table.add_column("model", no_wrap=True)
    table.add_column("problems", justify="right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    wide = passk.pivot_table(
        index=["subset", "level", "domain", "benchmark", "model"],
        columns="k",
        values="pass_at_k",
        aggfunc="first",
    )
    problems = passk.groupby(["subset", "level", "domain", "benchmark", "model"])["problems"].max()
    for subset in [s for s in ("all", "hard") if s in set(passk["subset"])]:
        rows = passk[passk["subset"] == subset]
        order = []
        for domain in sorted(set(rows.loc[rows["level"] == "domain", "domain"])):
            benches = sorted(
                set(
                    rows.loc[
                        (rows["level"] == "benchmark") & (rows["domain"] == domain), "benchmark"
                    ]
                )
            )
            order += [("benchmark", domain, b) for b in benches] + [("domain", domain, "")]
        order.append(("overall", "", ""))
        prefix = "hard: " if subset == "hard" else ""
        for level, domain, bench in order:
            scope = bench if level == "benchmark" else (f"{domain} (mean)" if domain else "overall")
            for model in models:
                key = (subset, level, domain, bench, model)
                if key not in wide.index:
                    continue
                cells = [f"{100 * wide.loc[key, k]:.1f}" for k in ks]
                head = [prefix + scope] + ([short_model_name(model)] if len(models) > 1 else [])
                style = None if level == "benchmark" else "bold"
                table.add_row(*head, str(int(problems[key])), *cells, style=style)
    return table


def train_table(log: pd.DataFrame, arm: str) -> Table:
    """One row per step: rewards, loss, B_shared / R on the probe before -> after, timings."""
    table = VerbatimTable(title=f"cdscope train ({arm})")
    rewards = [c for c in log.columns if c.startswith("reward_")]
    for name in ["step", "reward", *rewards, "loss", "B_shared %", "R %", "proj", "seconds"]:
        table.add_column(name, justify="right")
    for row in log.itertuples(index=False):
        r = row._asdict()
        table.add_row(
            str(r["step"]),
            f"{r['reward']:.3f}",
            *[f"{r[c]:.3f}" for c in rewards],
            f"{r['loss']:+.4f}",
            f"{100 * r['b_shared_before']:.2f} -> {100 * r['b_shared_after']:.2f}",
            f"{100 * r['r_before']:.2f} -> {100 * r['r_after']:.2f}",
            str(r["proj_iters"]),
            f"{r['step_s']:.1f}",
        )
    return table


def training_probe_series(log: pd.DataFrame) -> pd.DataFrame:
    """B_shared on the training probe by the steps done: state 0 is step 1's
    ``b_shared_before``, state t step t's ``b_shared_after`` (the next step opens there)."""
    if log.empty:
        return pd.DataFrame({"step": pd.Series(dtype=int), "b_shared": pd.Series(dtype=float)})
    first = pd.DataFrame({"step": [0], "b_shared": [float(log["b_shared_before"].iloc[0])]})
    after = pd.DataFrame({"step": log["step"].astype(int), "b_shared": log["b_shared_after"]})
    return pd.concat([first, after], ignore_index=True)


def evidence_table(
    log: pd.DataFrame, audit: pd.DataFrame | None, evals: pd.DataFrame | None
) -> Table:
    """Held-out evidence by the steps done: B_shared on the training probe beside the audit
    probe's (mean ± SE over its seeds), B_dir and B_norm there, and overall pass@k."""
    table = VerbatimTable(title="held-out evidence (by optimizer steps done)", title_justify="left")
    training = training_probe_series(log).set_index("step")["b_shared"]
    steps = set(training.index)
    by_step: dict[str, pd.DataFrame] = {}
    if audit is not None and len(audit):
        by_step["audit"] = audit.groupby("step")
        steps |= set(audit["step"])
    ks: list[int] = []
    if evals is not None and len(evals):
        overall = evals[evals["level"] == "overall"]
        ks = sorted(overall["k"].unique())
        by_step["eval"] = overall.set_index(["step", "k"])["pass_at_k"]
        steps |= set(overall["step"])
    headers = ["steps", "B_shared training %", "B_shared audit %", "B_dir audit %",
               "B_norm audit %", *[f"pass@{k} %" for k in ks]]  # fmt: skip
    for name in headers:
        table.add_column(name, justify="right")
    for step in sorted(steps):
        cells = [str(int(step)), f"{100 * training[step]:.2f}" if step in training.index else "-"]
        if "audit" in by_step and step in by_step["audit"].groups:
            at = by_step["audit"].get_group(step)
            se = at["b_shared"].std(ddof=1) / len(at) ** 0.5 if len(at) > 1 else float("nan")
            cells.append(f"{100 * at['b_shared'].mean():.2f} ± {100 * se:.2f}")
            cells += [f"{100 * at[m].mean():.2f}" for m in ("b_dir", "b_norm")]
        else:
            cells += ["-", "-", "-"]
        for k in ks:
            value = by_step["eval"].get((step, k))
            cells.append("-" if value is None else f"{100 * value:.1f}")
        table.add_row(*cells)
    return table


def stats_table(stats: pd.DataFrame) -> Table:
    """eval: per model, problems, samples, empty completions, tokens and throughput, and
    the share of the time spent verifying."""
    table = VerbatimTable(title="generation and verification", title_justify="left")
    for name in (
        "model",
        "problems",
        "samples",
        "empty",
        "tokens",
        "tokens/s",
        "generate s",
        "verify s",
        "verify share",
    ):
        table.add_column(name, justify="left" if name == "model" else "right")
    for row in stats.itertuples(index=False):
        table.add_row(
            short_model_name(str(row.model)),
            str(row.problems),
            str(row.samples),
            str(row.empty),
            str(row.tokens),
            "-" if pd.isna(row.tokens_per_s) else f"{row.tokens_per_s:.1f}",
            f"{row.generate_s:.1f}",
            f"{row.verify_s:.1f}",
            "-" if pd.isna(row.verify_share) else f"{100 * row.verify_share:.1f}%",
        )
    return table
