"""benchmarks/replication_report.py and replication.py on the runs themselves: run health
(collapsed policies, the post-hoc statistic), v3's capped CD-RFT arm and its plan, and the
pre-registration a report is given (synthetic ledgers: tests/replication_ledgers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cdscope.io import write_parquet
from tests.replication_ledgers import REPRODUCED, build, render, replication, report


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


def test_run_health_says_so_when_no_run_collapsed(tmp_path: Path) -> None:
    text = render(tmp_path, REPRODUCED)
    assert "No claim-1 run collapsed" in text and "Policy collapse" not in text


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
