"""benchmarks/replication_report.py on synthetic ledgers in the real file formats.

Each ledger is built so that the numbers the report must print are known: the audits'
per-probe-seed values are chosen so that Delta_s is exactly the stated delta and its
paper-style SE is a known constant, and the expected interval is computed here with
scipy.stats (the report uses cdscope.analysis.stats).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cdscope.analysis.stats import seeds_needed_interval
from cdscope.io import write_parquet

ROOT = Path(__file__).resolve().parents[1]
SEEDS, PROBES = list(range(6)), list(range(8))
#: per-probe-seed offsets of CD-RFT - GRPO that sum to 0: Delta_s is exact, and its SE over
#: the 8 probe seeds is 0.004 * sqrt(8 / 7) / sqrt(8) = 0.004 / sqrt(7)
WIGGLE = 0.004 * np.array([1, -1] * 4)
PROBE_SE_PP = 100 * 0.004 / math.sqrt(7)


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


replication = _load("replication")
report = _load("replication_report")


def _audit(path: Path, model: str, values: dict[str, np.ndarray]) -> None:
    rows = [
        {"model": model, "seed": p, "measure": m, "family": None, "family_b": None,
         "value_unit": "fraction", "value": float(v[p]), "boot_low": float(v[p]) - 0.1,
         "boot_high": float(v[p]) + 0.1}
        for m, v in values.items() for p in PROBES
    ]  # fmt: skip
    write_parquet(pd.DataFrame(rows), path, {"command": "synthetic"})


def _unit(folder: Path, model: str, shared: np.ndarray, done: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    plain = {"B_shared_C": shared, "B_dir": shared - 0.1, "B_norm": shared - 0.05}
    _audit(folder / "decompose.parquet", model, plain)
    mass = np.where(np.arange(8) == 0, 0.08, 0.01)  # one probe seed above the 5 % warning
    corrected = {"B_shared_C": shared, "B_shared_C_unbiased": shared + 0.25,
                 "gram_negative_mass": mass}  # fmt: skip
    _audit(folder / "bshared.parquet", model, corrected)
    write_parquet(pd.DataFrame({"model": [model]}), folder / "decompose.probe.parquet",
                  {"training_probe_overlap": {}})  # fmt: skip
    if done:
        (folder / "DONE").write_text("2026-11-28T00:00:00\n")


def _log(folder: Path, tau: float | None, start: float, steps: int = 5) -> None:
    step = np.arange(1, steps + 1)
    after = start - 0.02 * step
    frame = pd.DataFrame({
        "step": step, "reward": 0.1 + 0.05 * step, "b_shared_before": np.r_[start, after[:-1]],
        "b_shared_after_update": after + 0.01, "b_shared_after": after,
        "proj_iters": np.where(step <= 2, 2, 0) if tau else 0,
        "skipped_fraction": np.where(step == 1, 1.0, 0.25),  # step 1: nothing to learn
        **{c: float(i + 1) for i, c in enumerate(report.STEP_PHASES)},
    })  # fmt: skip
    config = {"seed": 0} | ({"tau": tau} if tau else {})
    write_parquet(frame, folder / "log.parquet", {"config": config})


#: the learn run's per-problem passes: 5 samples per problem, problems 0..5 in each of two
#: benchmarks (the same ids in both: a problem is (benchmark, problem_id)); the changes of
#: correct counts from step 0 are chosen so that the totals match eval.parquet's pass@1
#: (25 %, 30 %, 40 % of 60 samples) and each state's paired interval is known
SAMPLES = 5
CORRECT0 = {"math": [2, 1, 1, 1, 0, 2], "logic": [1, 2, 1, 1, 2, 1]}
CHANGE = {2: {"math": [0, 1, 0, 1, 0, 0], "logic": [1, 0, 0, 0, -1, 1]},
          4: {"math": [1, 2, 1, 1, 1, 1], "logic": [0, 1, 0, 1, 1, -1]}}  # fmt: skip


def _problems(folder: Path) -> None:
    rows = []
    for step in (0, *CHANGE):
        for fam, correct in CORRECT0.items():
            change = CHANGE[step][fam] if step else [0] * 6
            rows += [{"step": step, "benchmark": f"{fam}/b", "family": fam, "problem_id": str(i),
                      "samples": SAMPLES, "correct": c + d}
                     for i, (c, d) in enumerate(zip(correct, change, strict=True))]  # fmt: skip
    # a problem held at one state only: it must not enter any pair
    rows += [{"step": 0, "benchmark": "math/b", "family": "math", "problem_id": "dropped",
              "samples": SAMPLES, "correct": 5},
             {"step": 4, "benchmark": "logic/b", "family": "logic", "problem_id": "new",
              "samples": SAMPLES, "correct": 0}]  # fmt: skip
    write_parquet(pd.DataFrame(rows), folder / "eval_problems.parquet", {})


def build(
    root: Path, deltas_pp: list[float], finished: int = 6, learn: bool = True, problems: bool = True
) -> Path:
    """A ledger of the full design (seeds 0..5, 8 audit draws) with Delta_s = deltas_pp;
    seeds from ``finished`` on have GRPO done, CD-RFT still running (no DONE); the learn
    run's eval_problems.parquet only when ``problems``."""
    ledger = root / "ledger"
    ledger.mkdir(parents=True)
    (ledger / "plan.json").write_text(json.dumps({"seeds": SEEDS, "steps": 5}))
    call = "python benchmarks/replication.py --hours 2 --jobs 2 --doc docs/replication.md"
    (ledger / "commands.txt").write_text(f"{call}\n{call}\n{call} --phases report\n")
    records = [{"phase": "calibrate", "name": "base", "status": "done", "cmd": [],
                "seconds": 60.0, "at": 1000.0},
               {"phase": "train", "name": "grpo-s0", "status": "stopped by --hours", "cmd": [],
                "seconds": 120.0, "at": 1200.0},
               {"phase": "train", "name": "grpo-s0", "status": "done", "cmd": [],
                "seconds": 180.0, "at": 2000.0},
               {"phase": "train", "name": "cdrft-s0", "status": "done", "cmd": [],
                "seconds": 240.0, "at": 2060.0}]  # fmt: skip
    (ledger / "timings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (ledger / "calibration").mkdir()
    table = {str(s): {"b_shared": 63.0 + s, "tau": 53.0 + s} for s in SEEDS}
    (ledger / "calibration" / "calibration.json").write_text(json.dumps(table))
    (ledger / "calibration" / "DONE").write_text("x\n")
    base = 0.60 + 0.01 * (np.array(PROBES) - 3.5)
    _unit(ledger / "runs" / "base", "smollm2-135m", base)
    for s, delta in zip(SEEDS, deltas_pp, strict=True):
        grpo = base - 0.01 + 0.002 * s
        _unit(ledger / "runs" / f"grpo-s{s}", "grpo", grpo)
        _log(ledger / "runs" / f"grpo-s{s}", None, 0.63 + 0.01 * s)
        cdrft = grpo + delta / 100 + WIGGLE
        _unit(ledger / "runs" / f"cdrft-s{s}", "cdrft", cdrft, done=s < finished)
        _log(ledger / "runs" / f"cdrft-s{s}", 53.0 + s, 0.63 + 0.01 * s)
    if learn:
        folder = ledger / "learn"
        folder.mkdir()
        _log(folder, None, 0.6, steps=4)
        rows = []
        for step, p1 in ((0, 0.25), (2, 0.30), (4, 0.40)):
            for k, value in ((1, p1), (2, p1 + 0.1)):
                rows.append(
                    {
                        "step": step,
                        "level": "overall",
                        "family": "all",
                        "benchmark": "",
                        "k": k,
                        "pass_at_k": value,
                        "problems": 12,
                    }
                )
                for fam in ("math", "logic"):
                    rows.append(
                        {
                            "step": step,
                            "level": "family",
                            "family": fam,
                            "benchmark": "",
                            "k": k,
                            "pass_at_k": value,
                            "problems": 6,
                        }
                    )
                    rows.append({"step": step, "level": "benchmark", "family": fam,
                                 "benchmark": f"{fam}/b", "k": k, "pass_at_k": value,
                                 "problems": 6})  # fmt: skip
        write_parquet(pd.DataFrame(rows), folder / "eval.parquet", {})
        if problems:
            _problems(folder)
        audit = [{"step": step, "seed": p, "b_shared": 0.6 - 0.01 * step + 0.001 * p,
                  "b_dir": 0.5, "b_norm": 0.55, "b_shared_unbiased": 0.9,
                  "gram_negative_mass": 0.02} for step in (0, 2, 4) for p in PROBES]  # fmt: skip
        write_parquet(pd.DataFrame(audit), folder / "audit.parquet", {})
        (folder / "DONE").write_text("x\n")
    return ledger


def render(tmp_path: Path, deltas_pp: list[float], drawn: bool = False, **kwargs) -> str:
    """The report of ``build``'s ledger; its figures only when ``drawn`` (a second each:
    one test checks them)."""
    ledger = build(tmp_path, deltas_pp, **kwargs)
    doc = tmp_path / "doc" / "replication.md"
    args = replication.parse(["--out", str(tmp_path / "out"), "--ledger", str(ledger),
                              "--doc", str(doc), "--phases", "report"])  # fmt: skip
    with patch.object(report, "figures", report.figures if drawn else lambda *_: []):
        assert report.write_report(args) == doc
    return doc.read_text()


def tables(text: str) -> list[list[str]]:
    """The markdown's tables, each as its lines, with the heading above it first."""
    found, heading, current = [], "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if current:
            found.append([heading, *current])
            current = []
        if line.startswith("#") or (line and not line.startswith("!")):
            heading = line
    return found


def expected_interval(deltas_pp: list[float]) -> tuple[float, float, float, float]:
    d = np.asarray(deltas_pp)
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean(), d.std(ddof=1), d.mean() - half, d.mean() + half


REPRODUCED = [-6.5, -5.5, -6.0, -6.2, -5.8, -6.0]


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


def _rollouts(folder: Path, rewards: list[float], tokens: list[int], reg: list[float]) -> None:
    """Rewrite a unit's log with rollout columns: 2 prompts x G 2 x a 3-token cap = 12."""
    frame, meta = pd.read_parquet(folder / "log.parquet"), {}
    frame = frame.assign(reward=rewards, completion_tokens=tokens, grad_norm_reg=reg)
    meta = {"config": {"seed": 0, "tau": 56.0, "prompts_per_step": 2, "group_size": 2,
                       "max_new_tokens": 3}}  # fmt: skip
    write_parquet(frame, folder / "log.parquet", meta)


def test_run_health_names_a_collapsed_run_and_shows_the_rest_post_hoc(tmp_path: Path) -> None:
    """A step whose completions all hit the token cap with reward 0 is a collapsed policy;
    one at the cap with some reward, or with reward 0 below the cap, is not. The post-hoc
    interval is the paired t-interval of the seeds without a collapsed run; the verdict
    stays the pre-registered one over all six."""
    deltas = [-3.0, 2.0, -1.0, 25.0, -2.0, 0.5]
    ledger = build(tmp_path, deltas)
    runs = ledger / "runs"
    _rollouts(runs / "cdrft-s3", [0.4, 0.0, 0.0, 0.0, 0.0], [9, 12, 12, 12, 12],
              [11.8, 427.2, 14.6, 2.6, 37.5])  # fmt: skip
    _rollouts(runs / "grpo-s1", [0.5, 0.25, 0.0, 0.5, 0.5], [9, 12, 10, 12, 8], [0.0] * 5)
    doc = tmp_path / "doc" / "replication.md"
    args = replication.parse(["--out", str(tmp_path / "out"), "--ledger", str(ledger),
                              "--doc", str(doc), "--phases", "report"])  # fmt: skip
    with patch.object(report, "figures", lambda *_: []):
        text = report.write_report(args).read_text()
    health = text[text.index("## Run health") : text.index("## Claim 2")]
    rows = [r for r in health.splitlines() if r.startswith("| CD-RFT") or r.startswith("| GRPO")]
    assert rows == ["| CD-RFT s3 | 2, 3, 4, 5 | step 1: ‖λ∇R‖ 11.80, 2 projection "
                    "iteration(s), reward 0.40 | 427.2 |"]  # fmt: skip
    kept = [d for s, d in enumerate(deltas) if s != 3]
    mean, sd, lo, hi = (
        np.mean(kept), np.std(kept, ddof=1),
        *stats.t.interval(0.95, len(kept) - 1, np.mean(kept), stats.sem(kept)),
    )  # fmt: skip
    assert (f"over 5 seeds is {mean:+.2f} pp, SD {sd:.2f} pp, 95 % t-interval "
            f"[{lo:+.2f}, {hi:+.2f}] pp") in health  # fmt: skip
    assert "Policy collapse" in text and "CD-RFT s3" in text.split("Policy collapse")[1]
    row = next(r for r in text.splitlines() if r.startswith("| B_shared_C | CD-RFT − GRPO"))
    assert "| 6 |" in row and row.rstrip(" |").endswith("inconclusive")


def test_run_health_says_so_when_no_run_collapsed(full: tuple[Path, str]) -> None:
    assert "No claim-1 run collapsed" in full[1] and "Policy collapse" not in full[1]


def test_v3_caps_only_the_cdrft_arm_and_a_v2_plan_stays_valid(tmp_path: Path) -> None:
    """--proj-max-norm reaches CD-RFT's command and not GRPO's; a ledger planned before the
    option existed (v2's) still continues with its default, and refuses the option set."""
    out, ledger = tmp_path / "out", tmp_path / "ledger"
    (out / "calibration").mkdir(parents=True)
    (out / "calibration" / "calibration.json").write_text(json.dumps({"6": {"tau": 55.0}}))
    args = replication.parse(["--out", str(out), "--ledger", str(ledger), "--seeds", "6",
                              "--proj-max-norm", "10"])  # fmt: skip
    seen: dict[str, list[str]] = {}

    def runner(phase: str, name: str, argv: list[str]) -> bool:
        seen[name] = argv
        return False  # a budget stop: train_one returns before auditing

    for arm in ("grpo", "cdrft"):
        assert replication.train_one(args, runner, arm, 6) is False
    assert seen["cdrft-s6"][-2:] == ["--proj-max-norm", "10"]
    assert "--proj-max-norm" not in seen["grpo-s6"]
    v2 = {k: v for k, v in vars(replication.parse(["--seeds", "6"])).items()
          if k not in replication.FREE and k != "proj_max_norm"}  # fmt: skip
    for folder in (out, ledger):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.json").write_text(json.dumps(v2, default=str))
    replication.check_plan(replication.parse(["--out", str(out), "--ledger", str(ledger),
                                              "--seeds", "6"]))  # fmt: skip
    with pytest.raises(SystemExit, match="proj_max_norm"):
        replication.check_plan(args)


def test_the_report_copies_the_preregistration_it_is_given(tmp_path: Path) -> None:
    ledger = build(tmp_path, REPRODUCED)
    prereg = tmp_path / "prereg.md"
    prereg.write_text("## Pre-registration v3\n\nFixed before the run.\n")
    doc = tmp_path / "doc" / "replication-v3.md"
    args = replication.parse(["--out", str(tmp_path / "out"), "--ledger", str(ledger),
                              "--doc", str(doc), "--phases", "report", "--preregistration",
                              str(prereg), "--name", "Replication v3"])  # fmt: skip
    with patch.object(report, "figures", lambda *_: []):
        text = report.write_report(args).read_text()
    assert text.startswith("# Replication v3: ")
    assert "## Pre-registration v3\n\nFixed before the run.\n" in text
    assert text.index("Fixed before the run.") < text.index("# Results")
