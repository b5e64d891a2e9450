"""The figure of a training run's ``log.parquet`` (SPEC §5; ``cdscope report``).

Four panels against the optimizer step: the mean verifier reward (and each family's,
dashed); the GRPO loss; B_shared(C) on the fixed probe before the step and after it
(after the projection, for cdrft), in percent, with the projection threshold tau; and
the projection iterations taken. With held-out evidence (``--eval-every``,
``--audit-every``) a second figure puts the training probe's B_shared beside the audit
probe's and pass@k on held-out tasks over the steps (``evidence_figure``).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cdscope.output.plots import PALETTE, new_axes, styled
from cdscope.output.render_runs import training_probe_series


def no_projection(log: pd.DataFrame, regularizer: str, tau: float | None) -> str | None:
    """Why the projection panel is empty, or None when some step projected (SPEC §5: the
    projection runs in the CD-RFT arm only, while B_shared after the update is above tau)."""
    if regularizer != "cdrft":
        return f"no projection: --regularizer {regularizer}\n(GRPO alone) never projects"
    if len(log) and (log["proj_iters"] > 0).any():
        return None
    above = f" above tau = {tau:g}%" if tau is not None else " above tau"
    return f"no projection ran: B_shared(C) after\neach update was never{above}"


@styled
def train_figure(log: pd.DataFrame, regularizer: str = "cdrft", tau: float | None = None) -> Figure:
    """The four panels of the module doc; ``tau`` in percent (cdrft runs)."""
    fig, axes = new_axes(2, 2, (11, 6.4))
    step = log["step"]
    reward, loss, bshared, proj = axes.ravel()
    reward.plot(step, log["reward"], marker="o", color=PALETTE[0], label="all")
    families = [c for c in log.columns if c.startswith("reward_")]
    for i, column in enumerate(families, start=1):
        reward.plot(step, log[column], ls="--", marker=".", color=PALETTE[i % len(PALETTE)],
                    label=column.removeprefix("reward_"))  # fmt: skip
    reward.set(title="verifier reward (mean over completions)", ylabel="reward")
    reward.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    loss.plot(step, log["loss"], marker="o", color=PALETTE[1])
    loss.axhline(0, color="grey", lw=0.6)
    loss.set(title="GRPO loss", ylabel="loss")
    bshared.plot(step, 100 * log["b_shared_before"], marker="o", color=PALETTE[0],
                 label="before the step")  # fmt: skip
    bshared.plot(step, 100 * log["b_shared_after"], marker="s", color=PALETTE[2],
                 label="after the step" + (" and projection" if regularizer == "cdrft" else ""))  # fmt: skip
    if regularizer == "cdrft" and tau is not None:
        bshared.axhline(tau, color="#a50021", ls=":", lw=1.2, label=f"tau = {tau:g}%")
    bshared.set(title="B_shared(C) on the probe", ylabel="percent")
    bshared.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    proj.bar(step, log["proj_iters"], color=PALETTE[3], alpha=0.7)
    proj.set(title="projection iterations", ylabel="iterations")
    proj.yaxis.set_major_locator(MaxNLocator(integer=True))
    idle = no_projection(log, regularizer, tau)
    if idle:  # an empty panel would read as a plotting failure: say why it is empty
        proj.text(0.5, 0.5, idle, transform=proj.transAxes, ha="center", va="center",
                  fontsize=9, color="#404040", wrap=True)  # fmt: skip
    for ax in axes.ravel():
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"training run ({regularizer}): {len(log)} step(s)")
    return fig


@styled
def evidence_figure(
    log: pd.DataFrame, audit: pd.DataFrame | None, evals: pd.DataFrame | None
) -> Figure:
    """Held-out evidence against the steps done (``train.evidence``): B_shared on the
    training probe (what CD-RFT fits) beside the audit probe's (mean over its seeds, each
    seed a faint dot), and pass@k per family on the held-out tasks."""
    fig, axes = new_axes(1, 2, (11, 3.6))
    bshared, passk = axes.ravel()
    training = training_probe_series(log)
    bshared.plot(training["step"], 100 * training["b_shared"], marker="o", color=PALETTE[0],
                 label="training probe")  # fmt: skip
    if audit is not None and len(audit):
        mean = audit.groupby("step")["b_shared"].mean()
        bshared.plot(mean.index, 100 * mean, marker="s", color=PALETTE[1],
                     label=f"audit probe (mean of {audit['seed'].nunique()} seeds)")  # fmt: skip
        bshared.scatter(audit["step"], 100 * audit["b_shared"], s=9, color=PALETTE[1], alpha=0.35)
    bshared.set(title="B_shared(C): training vs audit probe", ylabel="percent")
    bshared.legend(frameon=False, fontsize=8)
    if evals is not None and len(evals):
        family = evals[evals["level"] == "family"]
        styles = ("-", "--", ":", "-.")
        for i, (name, rows) in enumerate(family.groupby("family")):
            for j, (k, at) in enumerate(rows.groupby("k")):
                passk.plot(at["step"], 100 * at["pass_at_k"], marker=".", ls=styles[j % 4],
                           color=PALETTE[i % len(PALETTE)], label=f"{name} pass@{k}")  # fmt: skip
        passk.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    passk.set(title="pass@k on held-out tasks", ylabel="percent")
    for ax in axes.ravel():
        ax.set_xlabel("optimizer steps done")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig
