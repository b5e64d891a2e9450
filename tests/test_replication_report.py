"""benchmarks/replication_report.py on synthetic ledgers (tests/replication_ledgers.py):
the claim-1 tables and verdict, the pre-registration, the separation of plain and corrected
B_shared, partial and corrupt ledgers, and claim 2."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cdscope.analysis.stats import seeds_needed_interval
from cdscope.io import write_parquet
from tests.replication_ledgers import (
    CHANGE,
    CORRECT0,
    PROBE_SE_PP,
    REPRODUCED,
    ROOT,
    SAMPLES,
    SEEDS,
    build,
    expected_interval,
    render,
    report,
    tables,
)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The finished design with deltas of -6 +- 0.5 pp, rendered once with its figures."""
    folder = tmp_path_factory.mktemp("full")
    return folder, render(folder, REPRODUCED, drawn=True)


@pytest.mark.parametrize(
    ("deltas", "word"),
    [(REPRODUCED, "reproduced"),
     ([-3.0, 2.0, -1.0, 1.5, -2.0, 0.5], "inconclusive"),
     ([5.0, 6.0, 7.0, 5.5, 6.5, 6.0], "contradicted")],
)  # fmt: skip
def test_the_primary_row_holds_the_paired_t_interval_and_the_preregistered_verdict(
    tmp_path: Path, full: tuple[Path, str], deltas: list[float], word: str
) -> None:
    text = full[1] if deltas is REPRODUCED else render(tmp_path, deltas)
    mean, sd, lo, hi = expected_interval(deltas)
    low, high = seeds_needed_interval(0.055, sd / 100, 6)
    row = next(r for r in text.splitlines() if r.startswith("| B_shared_C | CD-RFT − GRPO"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == ["6", f"{mean:+.2f}", f"{sd:.2f}", f"[{lo:+.2f}, {hi:+.2f}]"]
    assert cells[6].endswith(f"[{low:.0f}, {high:.0f}]")
    assert cells[7] == word
    assert f"**{word}**" in text  # the closing section says the same
    for s, delta in enumerate(deltas):  # per seed: Delta_s and the paper-style mean +- SE
        assert f"| s{s} |" in text
        assert f"| {delta:+.2f} | {delta:+.2f} ± {PROBE_SE_PP:.2f} | 8 |" in text


def test_the_preregistration_is_copied_verbatim_and_first(full: tuple[Path, str]) -> None:
    text = full[1]
    prereg = (ROOT / "docs/replication/preregistration.md").read_text().rstrip("\n")
    assert prereg in text
    assert text.index(prereg) < text.index("# Results") < text.index("## Claim 1")


def test_plain_and_noise_corrected_never_share_a_table(full: tuple[Path, str]) -> None:
    text = full[1]
    corrected_tables = 0
    for heading, *lines in tables(text):
        body = "\n".join(lines)
        corrected = "unbiased" in body
        plain = "GRPO_s" in body or "B_shared(C)" in body or "| B_shared_C |" in body
        assert not (corrected and plain), body
        if corrected:
            corrected_tables += 1
            assert "not comparable with the plain measure or the paper" in heading
    assert corrected_tables == 2  # claim 1's audits and the learn run's
    # the corrected value 25 points above the plain one is printed, flagged mass included
    assert "| base | 85.00 ± 0.87 | 1.9 (8.0) | 1 of 8 |" in text


def test_a_partial_ledger_says_what_has_not_run(tmp_path: Path) -> None:
    text = render(tmp_path, [-6.0, -6.5, -5.5, -6.2, -6.0, -6.0], finished=4, learn=False)
    assert "4 of 6 training seeds finished" in text
    assert "not run yet: CD-RFT s4, CD-RFT s5." in text
    assert "learn run (claim 2): not run yet" in text
    mean, _, lo, hi = expected_interval([-6.0, -6.5, -5.5, -6.2])
    assert f"| 4 | {mean:+.2f} |" in text and f"[{lo:+.2f}, {hi:+.2f}]" in text
    # an interval wholly below 0, but no verdict before the planned 6 seeds
    assert "no verdict yet (interim: 4 of 6 training seeds)" in text and "reproduced" not in text
    assert re.search(r"## Claim 2.*\n\nNot run yet\.", text)


def test_one_seed_gives_no_interval_and_no_verdict(tmp_path: Path) -> None:
    text = render(tmp_path, [-9.0] * 6, finished=1, learn=False)
    assert "no verdict yet (interim: 1 of 6 training seeds)" in text
    assert "| 1 | -9.00 | n/a | [n/a, n/a] | n/a |" in text


def test_timings_calibration_claim2_and_figures(full: tuple[Path, str]) -> None:
    folder, text = full
    # grpo-s0: one command stopped by --hours then one done: 2 + 3 minutes, 5 min wall
    assert "| GRPO training | 1 | 1 | 1 | 5.0 | 5.0 | 5.0 |" in text
    assert "| CD-RFT training | 1 | 1 | 0 | 4.0 | 4.0 | 4.0 |" in text
    assert "per call: 2, 2;" in text  # the report-only call is not a run
    assert "| GRPO | 30 | 1.0 | 2.0 | 3.0 | 4.0 | 5.0 | 6.0 |" in text
    # seed 2: calibration 65, tau 55; training probe 65 -> 55 over 5 steps; every step's
    # after-update value (64, 62, ..., 56) is above tau; 2 iterations in steps 1 and 2
    assert "| s2 | 65.00 | 55.00 | 65.00 → 55.00 | 65.00 → 55.00 | 5 of 5 | 4 |" in text
    # after the update = after + 1 pp: each of the 12 acting steps lowered it by 1 pp
    assert "(12 CD-RFT steps), it changed the training probe's B_shared" in text
    assert "by -1.00 pp on average (range -1.00 to -1.00); it rose in 0 of them." in text
    assert "| 4 | 40.0 (+15.0) | 50.0 (+15.0) | 12 |" in text
    assert "| math/b | 25.0 | 30.0 | 40.0 | +15.0 |" in text
    assert "| 4 | 56.35 ± 0.09 | 50.00 ± 0.00 | 55.00 ± 0.00 | -4.00 ± 0.00 |" in text
    assert "B_shared there (60.35 %) should equal the base audit's (60.00 %)" in text
    assert "- 12 of 60 claim-1 steps had nothing to learn" in text
    assert "- 1 of 4 learn-run steps had nothing to learn" in text
    for name in ("delta", "learn", "probe"):
        assert (folder / "doc" / "img" / f"replication-{name}.png").stat().st_size > 10_000
        assert f"(img/replication-{name}.png)" in text


def test_a_corrupt_or_ambiguous_ledger_is_refused_in_one_line(tmp_path: Path) -> None:
    ledger = build(tmp_path, [-6.0] * 6, learn=False)
    with open(ledger / "timings.jsonl", "a") as handle:
        handle.write("{not json\n")
    with pytest.raises(SystemExit, match=r"timings.jsonl line 5 is not JSON"):
        report.read_ledger(ledger)
    (ledger / "timings.jsonl").unlink()
    frame = pd.read_parquet(ledger / "runs/grpo-s0/decompose.parquet")
    frame.loc[frame.index[:3], "model"] = "other"
    write_parquet(frame, ledger / "runs/grpo-s0/decompose.parquet", {})
    with pytest.raises(SystemExit, match="holds several models"):
        report.pairs(report.read_ledger(ledger), "B_shared_C", SEEDS)
    log = pd.read_parquet(ledger / "runs/grpo-s2/log.parquet").iloc[:0]
    write_parquet(log, ledger / "runs/grpo-s2/log.parquet", {})
    with pytest.raises(SystemExit, match="logs no step, yet the unit is marked DONE"):
        report.read_ledger(ledger)
    (ledger / "runs/grpo-s2/DONE").unlink()  # unfinished: not read at all
    assert report.read_ledger(ledger).unit("grpo-s2") is None
    (ledger / "runs/grpo-s1/decompose.parquet").write_bytes(b"not parquet")
    with pytest.raises(SystemExit, match="not a readable Parquet file"):
        report.read_ledger(ledger)


def paired_pp(step: int, family: str | None = None) -> tuple[float, float, float, int]:
    """The expected mean change of per-problem pass@1 from step 0 (pp) and its 95 %
    t-interval over problems, from CHANGE with scipy.stats.t."""
    fams = [family] if family else list(CHANGE[step])
    d = 100 * np.concatenate([CHANGE[step][f] for f in fams]) / SAMPLES
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean(), d.mean() - half, d.mean() + half, d.size


def test_claim2_reports_the_paired_per_problem_interval(full: tuple[Path, str]) -> None:
    text = full[1]
    # the same totals as eval.parquet: mean pass@1 over the 12 paired problems at each state
    for step, after in ((2, 30.0), (4, 40.0)):
        for family in (None, "logic", "math"):
            mean, lo, hi, n = paired_pp(step, family)
            before = 100 * np.mean(sum((CORRECT0[f] for f in ([family] if family else CORRECT0)),
                                       [])) / SAMPLES  # fmt: skip
            if family is None:
                assert before == 25.0 and math.isclose(before + mean, after)
            now = before + mean
            row = (f"| {step} | {family or 'all'} | {n} | {before:.1f} | {now:.1f} | "
                   f"{mean:+.1f} | [{lo:+.1f}, {hi:+.1f}] |")  # fmt: skip
            assert row in text, row
    # the closing words follow the intervals: overall and math exclude 0, logic holds it
    mean, lo, hi, n = paired_pp(4)
    assert lo > 0 and paired_pp(4, "math")[1] > 0 and paired_pp(4, "logic")[1] < 0
    assert (f"- Claim 2: from step 0 to step 4 held-out pass@1, paired per problem, rose by "
            f"{mean:+.1f} pp (95 % t-interval [{lo:+.1f}, {hi:+.1f}] pp over 12 problems); "
            "per family: logic showed no detectable change") in text  # fmt: skip
    m_mean, m_lo, m_hi, _ = paired_pp(4, "math")
    assert (
        f"math rose by {m_mean:+.1f} pp (95 % t-interval [{m_lo:+.1f}, {m_hi:+.1f}] pp over 6"
        in text
    )
    assert "no per-problem" not in text and "cannot be computed" not in text


def test_claim2_without_per_problem_results_says_so(tmp_path: Path) -> None:
    text = render(tmp_path, [-6.0] * 6, problems=False)
    assert "This ledger has no `learn/eval_problems.parquet`" in text
    assert "the changes above carry no interval" in text
    assert ("- Claim 2: held-out pass@1 25.0 % at step 0 and 40.0 % at step 4 (+15.0 pp), "
            "without an interval (no per-problem results in this ledger).") in text  # fmt: skip
    assert "pass@1 at the state (%)" not in text


@pytest.mark.parametrize(
    ("change", "message"),
    [(lambda f: f.assign(correct=f["correct"] + 9), "correct outside \\[0, samples\\]"),
     (lambda f: f.assign(samples=0), "samples < 1"),
     (lambda f: pd.concat([f, f.iloc[:1]]), "holds a problem twice at one step"),
     (lambda f: f.drop(columns="problem_id"), "lacks the columns \\['problem_id'\\]")],
)  # fmt: skip
def test_corrupt_per_problem_results_are_refused_in_one_line(
    tmp_path: Path, change, message: str
) -> None:
    ledger = build(tmp_path, [-6.0] * 6)
    path = ledger / "learn" / "eval_problems.parquet"
    write_parquet(change(pd.read_parquet(path)), path, {})
    with pytest.raises(SystemExit, match=message):
        report.claim2_section(report.read_ledger(ledger))


def test_one_paired_problem_gives_no_interval(tmp_path: Path) -> None:
    ledger = build(tmp_path, [-6.0] * 6)
    path = ledger / "learn" / "eval_problems.parquet"
    frame = pd.read_parquet(path)
    write_parquet(frame[frame["problem_id"] == "0"].query("benchmark == 'math/b'"), path, {})
    lines, facts = report.claim2_section(report.read_ledger(ledger))
    assert "| 4 | all | 1 | 40.0 | 60.0 | +20.0 | [n/a, n/a] |" in lines
    assert report.change_words(facts["paired"].iloc[-1]) == (
        "changed by +20.0 pp on 1 problem (no interval)"
    )
