"""Run health in the replication report (benchmarks/replication_report.py): the claim-1 runs
whose policy collapsed, and the primary statistic without them, labelled post hoc.

Not pre-registered: seed 3's CD-RFT run collapsed after its first step (every completion at
the token cap, reward 0), which the pre-registration did not foresee. The section shows it
so a reader knows which audits measure a broken model; the verdict stays the
pre-registered one, over every seed.
"""

from __future__ import annotations

from replication_ledger import (
    ARMS,
    LABEL,
    PAPER_EFFECT,
    Ledger,
    collapsed_steps,
    interval,
    pairs,
)
from replication_text import fmt, table


def health_section(ledger: Ledger, seeds: list[int]) -> list[str]:
    """Runs whose policy collapsed (``collapsed_steps``), and the primary statistic without
    the seeds that hold one, labelled post hoc: the pre-registration did not foresee it."""
    found = {(arm, seed): collapsed_steps(ledger.unit(f"{arm}-s{seed}"))
             for seed in seeds for arm in ARMS}  # fmt: skip
    found = {key: steps for key, steps in found.items() if steps}
    lines = ["## Run health (not pre-registered)", ""]
    if not found:
        return [*lines, "No claim-1 run collapsed: no step had every completion at the token "
                "cap with reward 0.", ""]  # fmt: skip
    lines += ["A step's rollouts show a collapsed policy when every completion ran to the "
              "`--max-new-tokens` cap and earned reward 0; they come from the weights the "
              "step before left.", ""]  # fmt: skip
    rows = []
    for (arm, seed), steps in found.items():
        log = ledger.unit(f"{arm}-s{seed}").log.set_index("step")
        before = [s for s in log.index if s < steps[0]]
        last = before[-1] if before else None
        cause = "n/a" if last is None else (
            f"step {last}: ‖λ∇R‖ {log.at[last, 'grad_norm_reg']:.2f}, "
            f"{int(log.at[last, 'proj_iters'])} projection iteration(s), reward "
            f"{log.at[last, 'reward']:.2f}")  # fmt: skip
        rows.append([f"{LABEL[arm]} s{seed}", ", ".join(map(str, steps)), cause,
                     f"{log['grad_norm_reg'].max():.1f}"])  # fmt: skip
    lines += table(["run", "collapsed steps", "the step before the first", "largest ‖λ∇R‖"],
                   rows)  # fmt: skip
    lines += ["Why, and the opt-in cap `--proj-max-norm` that bounds a projection step: "
              "docs/train.md, \"When the projection breaks the policy\" (measured after this "
              "run, outside the pre-registration).", ""]  # fmt: skip
    kept = [s for s in seeds if not any((a, s) in found for a in ARMS)]
    frame = pairs(ledger, "B_shared_C", kept)
    if len(frame) >= 2:
        stat = interval(frame["delta"].to_numpy(), PAPER_EFFECT["B_shared_C"])
        lines += [f"Post hoc, not pre-registered (no verdict): without the seeds whose runs "
                  f"collapsed, mean Δ B_shared over {stat['n']} seeds is "
                  f"{fmt(100 * stat['mean'])} pp, SD {100 * stat['sd']:.2f} pp, 95 % "
                  f"t-interval [{fmt(100 * stat['lo'])}, {fmt(100 * stat['hi'])}] pp. A "
                  "collapsed policy's B_shared measures a broken model, which is why this "
                  "is shown; dropping a seed after seeing it is why it decides nothing.", ""]  # fmt: skip
    return lines
