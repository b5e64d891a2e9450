"""The report of benchmarks/replication.py (replication v2, issue 36): the markdown.

Reads only the ledger (``args.ledger``; replication_ledger.py) and writes ``args.doc`` (or
``OUT/replication.md``) with its figures in ``img/`` beside it (replication_figures.py).
The pre-registration (docs/replication/preregistration.md) is copied verbatim above the
results and never rewritten. The statistics and the verdict rule are replication_ledger's
(module doc there); every sentence below that states a result is generated from the
numbers, none is written in advance.
"""

from __future__ import annotations

import math
from argparse import Namespace
from pathlib import Path

import pandas as pd
from replication_figures import figures
from replication_health import health_section
from replication_ledger import (
    ARMS,
    CLIPPED,
    CORRECTED,
    LABEL,
    PAPER_EFFECT,
    PAPER_SE,
    PLAIN,
    STEP_PHASES,
    Ledger,
    against_base,
    collapsed_steps,
    idle_steps,
    interval,
    jobs_of,
    pairs,
    parts,
    probe_fit,
    problem_changes,
    projection_changes,
    read_ledger,
    seeds_text,
    training_curve,
    unit_label,
    verdict,
)
from replication_text import change_words, fmt, pm, table

from cdscope.analysis.noise import CLIPPED_MASS_WARN
from cdscope.analysis.stats import mean_se, paired_t_power

#: the SD of Delta_s above which the pre-registration expected an inconclusive verdict
SD_EXPECTED = 0.04
PAPER_PP = f"{-100 * PAPER_EFFECT['B_shared_C']:g}"  # the paper's paired effect: -5.5
ROOT = Path(__file__).resolve().parents[1]
#: how the noise-corrected column is labelled wherever it appears
NOT_COMPARABLE = "not comparable with the plain measure or the paper"

__all__ = ["PAPER_EFFECT", "interval", "seeds_text", "write_report"]


def finished_seeds(ledger: Ledger, seeds: list[int]) -> list[int]:
    return [s for s in seeds if all(ledger.unit(f"{a}-s{s}") for a in ARMS)]


# -- sections --------------------------------------------------------------------------------


def status_section(ledger: Ledger, seeds: list[int]) -> list[str]:
    done = finished_seeds(ledger, seeds)
    missing = [f"{LABEL[a]} s{s}" for s in seeds for a in ARMS if not ledger.unit(f"{a}-s{s}")]
    state = {True: "finished", False: "not run yet"}
    lines = ["## Status", ""]
    lines.append(f"- Claim 1: {len(done)} of {len(seeds)} training seeds finished (both arms "
                 "trained and audited)" + (f"; not run yet: {', '.join(missing)}." if missing
                                           else "."))  # fmt: skip
    lines.append(f"- Calibration: {state[bool(ledger.calibration)]}; base audit: "
                 f"{state[ledger.unit('base') is not None]}; learn run (claim 2): "
                 f"{state[ledger.unit('learn') is not None]}.")  # fmt: skip
    return [*lines, ""]


def command_section(args: Namespace, ledger: Ledger) -> list[str]:
    calls = [c for c in ledger.commands if "--phases report" not in c]  # re-renders only
    unique = list(dict.fromkeys(calls))
    lines = ["## Command, settings and wall time", "", "```bash", *unique, "```", ""]
    if len(calls) > len(unique):
        lines += [f"({len(calls)} calls in all: a repeated call continues the stopped run.)", ""]
    settings = ", ".join(f"{k} = {v}" for k, v in ledger.plan.items())
    lines += [f"Settings (`{ledger.root.name}/plan.json`): {settings or 'not recorded'}.", ""]
    jobs = [jobs_of(c) for c in calls]
    if jobs:
        lines += [f"Units at a time (`--jobs`) per call: {', '.join(map(str, jobs))}; each "
                  "unit is one process at one thread (`OMP_NUM_THREADS=1`).", ""]  # fmt: skip
    frame = parts(ledger.timings)
    if not frame.empty:
        rows = [[r.part, r.units, r.done, r.stopped, f"{r.minutes:.1f}", f"{r.wall:.1f}",
                 f"{r.per_unit:.1f}"] for r in frame.itertuples()]  # fmt: skip
        lines += [
            "Wall time per part (`timings.jsonl`; a command stopped by `--hours` "
            "continued from its checkpoint on the next call and counts too):",
            "",
        ]
        lines += table(["part", "units", "commands done", "stopped by --hours", "minutes of "
                        "commands", "wall minutes", "median minutes per unit"], rows)  # fmt: skip
        lines += [f"In all {frame['minutes'].sum():.1f} minutes of commands.", ""]
    rows = []
    for name, runs in (("GRPO", "grpo"), ("CD-RFT", "cdrft"), ("learn (GRPO)", "learn")):
        logs = [u.log for n, u in ledger.units.items() if n.split("-s")[0] == runs and
                u.log is not None]  # fmt: skip
        if logs:
            log = pd.concat(logs)
            rows.append([name, len(log), *[f"{log[c].median():.1f}" for c in STEP_PHASES]])
    if rows:
        lines += ["Median seconds per training step, by phase (`log.parquet`):", ""]
        lines += table(["run", "steps logged", *STEP_PHASES], rows)
    return lines


def calibration_section(ledger: Ledger, seeds: list[int]) -> list[str]:
    lines = ["## Calibration: tau_s and the projection", ""]
    if not ledger.calibration:
        return [*lines, "Not run yet.", ""]
    lines += ["Base B_shared(C) on each seed's training probe (`calibration/calibration.json`), "
              "the tau_s the CD-RFT run was given (its log's config), and the training probe's "
              "B_shared before step 1 (first) and after the last step (last), in %. The "
              "projection runs while B_shared after the update exceeds tau_s.", ""]  # fmt: skip
    rows = []
    for seed in seeds:
        base = ledger.calibration.get(seed, {}).get("b_shared", math.nan)
        cells, tau, acted, iters = [], ledger.calibration.get(seed, {}).get("tau"), "n/a", "n/a"
        for arm in ARMS:
            unit = ledger.unit(f"{arm}-s{seed}")
            if unit is None or unit.log is None:
                cells.append("not run yet")
                continue
            curve = training_curve(unit.log)
            b = 100 * curve["b_shared"]
            cells.append(f"{b.iloc[0]:.2f} → {b.iloc[-1]:.2f}")
            if arm == "cdrft":
                tau = unit.log_meta.get("config", {}).get("tau", tau)
                over = (100 * unit.log["b_shared_after_update"] > tau).sum()
                acted = f"{over} of {len(unit.log)}"
                iters = str(int(unit.log["proj_iters"].sum()))
        rows.append([f"s{seed}", fmt(base, 2, False), fmt(tau or math.nan, 2, False), *cells,
                     acted, iters])  # fmt: skip
    lines += table(["seed", "base B_shared, training probe", "tau_s", "GRPO: first → last",
                    "CD-RFT: first → last", "CD-RFT steps above tau_s after the update",
                    "projection iterations"], rows)  # fmt: skip
    moved = projection_changes(ledger, seeds)
    if moved.size:
        lines += [
            f"Where the projection ran ({moved.size} CD-RFT steps), it changed the training "
            f"probe's B_shared from its value after the update by {fmt(moved.mean())} pp on "
            f"average (range {fmt(moved.min())} to {fmt(moved.max())}); it rose in "
            f"{int((moved > 0).sum())} of them.",
            "",
        ]
    shared = {n: sum(len(v) for v in u.probe_meta.get("training_probe_overlap", {}).values())
              for n, u in ledger.units.items() if u.probe_meta}  # fmt: skip
    if shared:
        overlapping = [f"{n} ({k})" for n, k in shared.items() if k]
        lines += ["Audit items shared with a training probe (`decompose.probe.parquet`): " +
                  (", ".join(overlapping) if overlapping else
                   f"none in any of the {len(shared)} audits."), ""]  # fmt: skip
    return lines


def claim1_section(ledger: Ledger, seeds: list[int]) -> tuple[list[str], dict]:
    """The per-seed table, the pre-registered test and the secondaries; also returns the
    primary statistic for the closing section."""
    lines = ["## Claim 1 (primary): CD-RFT − GRPO on held-out B_shared", ""]
    frame = pairs(ledger, "B_shared_C", seeds)
    stat = interval(frame["delta"].to_numpy(), PAPER_EFFECT["B_shared_C"])
    if frame.empty:
        return [*lines, "Not run yet: no training seed has both arms audited.", ""], stat
    base = ledger.unit("base")
    if base is not None and base.decompose is not None:
        cells = [f"{m} {pm(*mean_se(100 * base.values(m).to_numpy()), sign=False)} %"
                 for m in PLAIN]  # fmt: skip
        lines += [
            f"The base model on the same audit draws (mean ± SE over probe seeds): "
            f"{', '.join(cells)}.",
            "",
        ]
    rows = [[f"s{r.seed}", f"{100 * r.grpo:.2f}", f"{100 * r.cdrft:.2f}", fmt(100 * r.delta),
             pm(100 * r.delta, 100 * r.probe_se), r.probe_seeds]
            for r in frame.itertuples()]  # fmt: skip
    lines += ["Per training seed, plain B_shared(C) on the audit half, mean over the audit's "
              "probe seeds (%), and Δ_s = CD-RFT_s − GRPO_s (pp):", ""]  # fmt: skip
    lines += table(["training seed", "GRPO_s", "CD-RFT_s", "Δ_s", "paper-style: mean ± SE "
                    "over probe seeds of the per-probe-seed Δ", "probe seeds"], rows)  # fmt: skip
    lines += ["The two Δ columns hold the same mean (both models are audited on the same "
              "draws). The paper-style ± is the SE over the audit's probe seeds of one trained "
              "pair: it measures how much the probe draw moves Δ, not how much another "
              "training seed would. The pre-registered test uses the spread over training "
              "seeds:", ""]  # fmt: skip
    head = ["measure", "comparison", "training seeds", "mean Δ (pp)", "SD over seeds (pp)",
            "95 % t-interval (pp)", "seeds for the paper's Δ at this SD [95 % range]",
            "verdict"]  # fmt: skip
    lines += table(head, [stat_row("B_shared_C", "CD-RFT − GRPO", stat,
                                   verdict(stat, len(seeds)))], right=2)  # fmt: skip
    if math.isfinite(stat["sd"]):
        power = paired_t_power(PAPER_EFFECT["B_shared_C"], stat["sd"], max(len(seeds), 2))
        side = "above" if stat["sd"] > SD_EXPECTED else "below"
        lines += [f"The measured SD of Δ_s, {100 * stat['sd']:.2f} pp over {stat['n']} seeds, is "
                  f"{side} the ~{100 * SD_EXPECTED:g} pp above which the pre-registration "
                  f"expected this design to be inconclusive: at it a paired t-test over "
                  f"{len(seeds)} seeds detects the paper's {PAPER_PP} pp with power "
                  f"{power:.2f}, and 80 % power needs {seeds_text(stat)} seeds (95 % range "
                  "from the SD's chi-square interval).", ""]  # fmt: skip
    rows = []
    for measure in PLAIN:
        if measure != "B_shared_C":
            sec = interval(pairs(ledger, measure, seeds)["delta"].to_numpy(),
                           PAPER_EFFECT.get(measure, math.nan))  # fmt: skip
            rows.append(stat_row(measure, "CD-RFT − GRPO", sec, "secondary: no verdict"))
        for arm in ARMS:
            diff = interval(against_base(ledger, measure, seeds, arm))
            rows.append(stat_row(measure, f"{LABEL[arm]} − base", diff, "secondary: no verdict"))
    lines += ["### Secondary (pre-registered as reported, not tested)", ""]
    lines += table(head, rows, right=2)
    return [*lines, *corrected_section(ledger, seeds)], stat


def stat_row(measure: str, name: str, stat: dict, word: str) -> list[str]:
    return [measure, name, stat["n"], fmt(100 * stat["mean"]), fmt(100 * stat["sd"], 2, False),
            f"[{fmt(100 * stat['lo'])}, {fmt(100 * stat['hi'])}]", seeds_text(stat), word]  # fmt: skip


def corrected_section(ledger: Ledger, seeds: list[int]) -> list[str]:
    """The noise-corrected B_shared with its clipped mass, apart from the plain tables."""
    names = ["base", *[f"{a}-s{s}" for s in seeds for a in ARMS]]
    rows = []
    for name in names:
        unit = ledger.unit(name)
        if unit is None or unit.bshared is None:
            continue
        value, clipped = unit.values(CORRECTED, "bshared"), unit.values(CLIPPED, "bshared")
        if value.empty:
            continue
        mean, se = mean_se(100 * value.to_numpy())
        over = int((clipped > CLIPPED_MASS_WARN).sum())
        rows.append([unit_label(name),
                     pm(mean, se, False), f"{100 * clipped.mean():.1f} ({100 * clipped.max():.1f})",
                     f"{over} of {len(clipped)}"])  # fmt: skip
    if not rows:
        return []
    lines = [f"### Noise-corrected B_shared ({NOT_COMPARABLE})", ""]
    lines += [
        f"`{CORRECTED}` from `cdscope bshared --from` each audit's probe frame: an "
        "estimator of another quantity (the expected rows' Gram, docs/bshared.md), "
        f"{NOT_COMPARABLE}; it is never subtracted from or set against the plain "
        f"values above. `{CLIPPED}`: the share of eigenvalue mass clipped to read it "
        f"(above {100 * CLIPPED_MASS_WARN:g} % the corrected value is unreliable).",
        "",
    ]
    lines += table(["model", f"{CORRECTED}: mean ± SE over probe seeds (%)",
                    f"{CLIPPED}: mean (max) (%)",
                    f"probe seeds above {100 * CLIPPED_MASS_WARN:g} %"], rows)  # fmt: skip
    within = interval(pairs(ledger, CORRECTED, seeds, "bshared")["delta"].to_numpy())
    if within["n"]:
        lines += [
            f"Within the corrected measure only, CD-RFT − GRPO over {within['n']} "
            f"training seeds: {fmt(100 * within['mean'])} pp, 95 % t-interval "
            f"[{fmt(100 * within['lo'])}, {fmt(100 * within['hi'])}].",
            "",
        ]
    return lines


def claim2_section(ledger: Ledger) -> tuple[list[str], dict]:
    """pass@k and the audit at each evidence state of the learn run, and its reward."""
    lines = ["## Claim 2: does GRPO learn? (the learn run)", ""]
    learn = ledger.unit("learn")
    facts: dict = {}
    if learn is None:
        return [*lines, "Not run yet.", ""], facts
    if learn.eval is not None and not learn.eval.empty:
        evals = learn.eval
        overall = evals[evals["level"] == "overall"].pivot_table(index="step", columns="k",
                                                                 values="pass_at_k") * 100  # fmt: skip
        problems = evals[evals["level"] == "overall"].groupby("step")["problems"].max()
        change = overall - overall.iloc[0]
        rows = [[step, *[f"{overall.loc[step, k]:.1f} ({fmt(change.loc[step, k], 1)})"
                         for k in overall.columns], problems.loc[step]]
                for step in overall.index]  # fmt: skip
        lines += ["pass@k on the fixed held-out split (`curriculum/eval`; `learn/eval.parquet`) "
                  "at each evidence state, % (change from step 0 in pp):", ""]  # fmt: skip
        lines += table(["steps done", *[f"pass@{k}" for k in overall.columns], "problems"], rows)
        for level in ("family", "benchmark"):
            part = evals[(evals["level"] == level) & (evals["k"] == 1)]
            wide = part.pivot_table(index=level if level == "benchmark" else "family",
                                    columns="step", values="pass_at_k") * 100  # fmt: skip
            rows = [[name, *[f"{v:.1f}" for v in row], fmt(row.iloc[-1] - row.iloc[0], 1)]
                    for name, row in wide.iterrows()]  # fmt: skip
            lines += [f"pass@1 per {level} (%):", ""]
            lines += table([level, *[f"step {s}" for s in wide.columns], "last − first (pp)"], rows)
        facts["pass1"] = (overall.index[0], overall.index[-1], overall.iloc[0].get(1, math.nan),
                          overall.iloc[-1].get(1, math.nan))  # fmt: skip
    if learn.eval_problems is not None:
        lines += paired_pass1(learn.eval_problems, facts)
    elif "pass1" in facts:
        lines += ["This ledger has no `learn/eval_problems.parquet` (it predates per-problem "
                  "results; `eval.parquet` holds pass@k per benchmark, family and overall "
                  "with the problem counts only), so the pre-registered paired interval over "
                  "held-out problems cannot be computed from it: the changes above carry no "
                  "interval.", ""]  # fmt: skip
    if learn.audit is not None and not learn.audit.empty:
        lines += audit_table(learn.audit, facts)
        base = ledger.unit("base")
        first = learn.audit[learn.audit["step"] == 0]
        if base is not None and not base.values("B_shared_C").empty and not first.empty:
            lines += [
                "A check: at step 0 the learn run holds the base weights, and its audit draws "
                f"are the decompose audit's, so its B_shared there ({100 * first['b_shared'].mean():.2f} %) "
                f"should equal the base audit's ({100 * base.values('B_shared_C').mean():.2f} %).",
                "",
            ]
    if learn.log is not None and not learn.log.empty:
        log = learn.log.sort_values("step")
        span = max(1, min(10, len(log) // 4))
        first, last = log["reward"].head(span).mean(), log["reward"].tail(span).mean()
        lines += [f"Training reward (`learn/log.parquet`, figure (b)): mean {first:.3f} over "
                  f"the first {span} steps, {last:.3f} over the last {span}. The training "
                  "reward mixes learning with the prompt mix each step draws; the held-out "
                  "pass@k above is the pre-registered reading.", ""]  # fmt: skip
    return lines, facts


def paired_pass1(problems: pd.DataFrame, facts: dict) -> list[str]:
    """The pre-registered claim-2 reading: per state, the paired change of per-problem
    pass@1 from the first state with its t-interval over problems (replication_ledger)."""
    changes = problem_changes(problems, "learn/eval_problems.parquet")
    if changes.empty:
        return ["`learn/eval_problems.parquet` holds fewer than two evidence states: no "
                "change to pair.", ""]  # fmt: skip
    facts["paired"] = changes
    first = changes["first"].iloc[0]
    rows = [[r.step, r.family, r.n, fmt(100 * r.before, 1, False), fmt(100 * r.after, 1, False),
             fmt(100 * r.mean, 1), f"[{fmt(100 * r.lo, 1)}, {fmt(100 * r.hi, 1)}]"]
            for r in changes.itertuples()]  # fmt: skip
    lines = [f"Per-problem pass@1 (correct / samples, `learn/eval_problems.parquet`), paired "
             f"over the held-out problems held at both step {first} and the state: mean pass@1 "
             "at each, and the mean change with its 95 % Student-t interval over problems "
             "(the pre-registered statistic), over all problems and per family:", ""]  # fmt: skip
    header = ["steps done", "family", "problems", f"pass@1 at step {first} (%)",
              "pass@1 at the state (%)", "change (pp)", "95 % t-interval (pp)"]  # fmt: skip
    return lines + table(header, rows, right=2)


def audit_table(audit: pd.DataFrame, facts: dict) -> list[str]:
    """The learn run's audit per state: plain measures, the change from step 0 over the same
    draws, and the noise-corrected one in its own table."""
    start = audit[audit["step"] == audit["step"].min()].set_index("seed")
    rows, corrected = [], []
    for step, group in audit.groupby("step"):
        group = group.set_index("seed")
        cells = [pm(*mean_se(100 * group[m].to_numpy()), sign=False) for m in
                 ("b_shared", "b_dir", "b_norm")]  # fmt: skip
        change = (group["b_shared"] - start["b_shared"]).dropna().to_numpy() * 100
        rows.append([step, *cells, pm(*mean_se(change))])
        corrected.append([step, pm(*mean_se(100 * group["b_shared_unbiased"].to_numpy()), False),
                          f"{100 * group['gram_negative_mass'].max():.1f}"])  # fmt: skip
        facts["audit"] = (audit["step"].min(), step, float(change.mean()))
    lines = [
        "Audit of the learn run's states (`learn/audit.parquet`, the same draws of the "
        "audit half at every state), mean ± SE over the audit's probe seeds (%):",
        "",
    ]
    lines += table(["steps done", "B_shared(C)", "B_dir", "B_norm",
                    "B_shared change from step 0 (pp)"], rows)  # fmt: skip
    lines += [f"Noise-corrected ({NOT_COMPARABLE}):", ""]
    lines += table(["steps done", "b_shared_unbiased (%)", f"{CLIPPED}, max (%)"], corrected)
    return lines


def closing_section(
    ledger: Ledger, seeds: list[int], stat: dict, facts: dict, audit_n: int
) -> list[str]:
    """What the numbers do and do not show, generated from them."""
    lines = ["## What this does and does not show", ""]
    if stat["n"]:
        word = verdict(stat, len(seeds))
        lines.append(f"- Claim 1 by the pre-registered rule: **{word}** — mean Δ B_shared "
                     f"{fmt(100 * stat['mean'])} pp over {stat['n']} of {len(seeds)} training "
                     f"seeds, 95 % t-interval [{fmt(100 * stat['lo'])}, "
                     f"{fmt(100 * stat['hi'])}] pp, against the paper's {PAPER_PP} ± "
                     f"{100 * PAPER_SE['B_shared_C']:g} pp.")  # fmt: skip
        if math.isfinite(stat["sd"]):
            lines.append(f"- The SD of Δ_s over training seeds is {100 * stat['sd']:.2f} pp; at "
                         "that SD a paired t-test needs "
                         f"{seeds_text(stat)} seeds (95 % range from the SD's own uncertainty) "
                         f"to detect the paper's {PAPER_PP} pp with 80 % power.")  # fmt: skip
        probe = pairs(ledger, "B_shared_C", seeds)["probe_se"].dropna()
        if len(probe) and math.isfinite(stat["sd"]):
            lines.append(f"- Probe noise of one pair (median paper-style SE "
                         f"{100 * probe.median():.2f} pp) against training-seed spread (SD "
                         f"{100 * stat['sd']:.2f} pp): a ± over probe seeds, as the paper "
                         "reports, describes one trained pair, not the method.")  # fmt: skip
        fitted = probe_fit(ledger, seeds)
        if fitted is not None:
            lines.append(f"- On its own training probe CD-RFT ended {fmt(fitted, 2)} pp from "
                         "GRPO (mean over seeds of the last-step difference); on the held-out "
                         f"audit the difference is {fmt(100 * stat['mean'])} pp. The training "
                         "probe's value shows what the regulariser fitted; only the audit's "
                         "speaks for the model.")  # fmt: skip
    else:
        lines.append("- Claim 1: no training seed has both arms audited yet; nothing is shown.")
    collapsed = [f"{LABEL[a]} s{s}" for s in seeds for a in ARMS
                 if collapsed_steps(ledger.unit(f"{a}-s{s}"))]  # fmt: skip
    if collapsed:
        lines.append(f"- Policy collapse (not foreseen by the pre-registration): "
                     f"{', '.join(collapsed)} — every completion at the token cap with reward "
                     "0 from some step on (Run health). Its audit B_shared is that of a "
                     "broken model, and it is in the primary test as pre-registered.")  # fmt: skip
    runs = [u.log for n, u in ledger.units.items() if n.split("-s")[0] in ARMS]
    for name, logs in (
        ("claim-1", runs),
        ("learn-run", [getattr(ledger.unit("learn"), "log", None)]),
    ):
        idle, steps = idle_steps(logs)
        if idle:
            lines.append(
                f"- {idle} of {steps} {name} steps had nothing to learn (`skipped_fraction` 1: "
                "every group's rewards were equal, so the policy gradient was 0)."
            )
    if "paired" in facts:
        changes = facts["paired"]
        last = changes[changes["step"] == changes["step"].max()]
        overall = last.iloc[0]
        families = "; ".join(
            f"{r['family']} {change_words(r)}" for _, r in last.iloc[1:].iterrows()
        )
        lines.append(f"- Claim 2: from step {overall['first']} to step {overall['step']} held-out "
                     f"pass@1, paired per problem, {change_words(overall)}"
                     + (f"; per family: {families}." if families else "."))  # fmt: skip
    elif "pass1" in facts:
        s0, s1, p0, p1 = facts["pass1"]
        lines.append(f"- Claim 2: held-out pass@1 {p0:.1f} % at step {s0} and {p1:.1f} % at "
                     f"step {s1} ({fmt(p1 - p0, 1)} pp), without an interval (no per-problem "
                     "results in this ledger).")  # fmt: skip
    if "audit" in facts:
        s0, s1, change = facts["audit"]
        lines.append(
            f"- The learn run's audit B_shared moved {fmt(change)} pp from step {s0} "
            f"to step {s1} (one run: the ± is probe noise, not a seed interval)."
        )
    lines.append(f"- The noise-corrected B_shared is {NOT_COMPARABLE}; the plain B_shared is "
                 f"an n-dependent estimator (n = {audit_n} per family here), so only the paired Δ "
                 "within this design is read against the paper's effect, not the levels. "
                 "The paper's effects come from 7B models trained far longer.")  # fmt: skip
    return [*lines, ""]


def write_report(args: Namespace) -> Path:
    """``args.doc`` (or OUT/replication.md) from the ledger, figures in its ``img/``."""
    doc = Path(args.doc) if args.doc else Path(args.out) / "replication.md"
    ledger = read_ledger(Path(args.ledger))
    seeds = list(args.seeds)
    made = figures(ledger, seeds, doc.parent / "img", doc.stem)
    prereg = (
        args.preregistration if args.preregistration.is_absolute() else ROOT / args.preregistration
    )
    lines = [f"# {args.name}: does CD-RFT leave less shared control than GRPO, and does "
             "GRPO learn?", "",
             "The paper's training claims re-measured on the embedded model with a design "
             "fixed before it ran (issue 36): per training seed a GRPO and a CD-RFT run "
             "from the same base, audited on held-out probe items, compared paired over "
             "training seeds; and one longer GRPO run evaluated on a fixed held-out split. "
             "Written by `benchmarks/replication.py --phases report` from the ledger "
             f"`{ledger.root}` alone; the pre-registration below is copied verbatim from "
             f"`{args.preregistration}`, everything after it was measured.", ""]  # fmt: skip
    lines += [prereg.read_text(encoding="utf-8").rstrip("\n"), "", "# Results", ""]
    lines += status_section(ledger, seeds)
    lines += command_section(args, ledger)
    lines += calibration_section(ledger, seeds)
    claim1, stat = claim1_section(ledger, seeds)
    claim2, facts = claim2_section(ledger)
    lines += claim1 + health_section(ledger, seeds) + claim2
    if made:
        lines += ["## Figures", "", *[f"![{p.stem}](img/{p.name})" for p in made], ""]
    lines += closing_section(ledger, seeds, stat, facts, args.audit_n)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines), encoding="utf-8")
    return doc
