"""Held-out evidence while training (issue 35, parts 2-4): OUT/eval.parquet, OUT/audit.parquet,
the new log columns and metadata, checked against the commands a user would run afterwards
on the saved model (``cdscope eval``, ``cdscope decompose``) and against a run without
evidence; and the bad input the issue lists."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cdscope.commands.train import run_train
from cdscope.core.probes import TRAINING_PROBE_FILE, read_training_probe
from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from cdscope.tasks import Verdict
from cdscope.train.evidence import AUDIT_NAME, EVAL_NAME, EVAL_PROBLEMS_NAME, due, heldout_paths
from tests.helpers import (
    TIMING_COLUMNS,
    byte_tokenizer,
    config,
    invoke,
    parity_reward,
    tiny_model,
    train_files,
    write_eval_tasks,
    write_tasks_file,
)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {**train_files(tmp_path, 8), "eval": write_eval_tasks(tmp_path / "eval.jsonl")}


@pytest.fixture
def odd_verifier(monkeypatch):
    """Held-out verdicts that depend on each completion's exact text (a tiny random model
    passes no real verifier): a completion passes when its length is even."""
    import cdscope.tasks as tasks

    def verify_many(tasks_, completions, timeout=5.0, workers=2):  # noqa: ANN001, ANN202
        return [Verdict(len(c) % 2 == 0, "even" if len(c) % 2 == 0 else "odd") for c in completions]

    monkeypatch.setattr(tasks, "verify_many", verify_many)


def evidence_config(files, out: Path, **changes):  # noqa: ANN001, ANN201
    settings = dict(
        steps=3, eval_every=2, eval_tasks=(str(files["eval"]),), eval_n=3, eval_k=(1, 2),
        eval_max_new_tokens=4, audit_every=1, audit_seeds=2, audit_n=2, save_every=1,
    )  # fmt: skip
    return config(files, out, **(settings | changes))


def run(cfg, **kwargs):  # noqa: ANN001, ANN201
    model = kwargs.pop("model", None) or tiny_model("llama", "sdpa")
    result = run_train(
        cfg, model=model, tokenizer=byte_tokenizer(), reward_fn=parity_reward, **kwargs
    )
    return result, model


def test_evidence_files_log_columns_and_metadata(files, tmp_path, odd_verifier) -> None:
    out = tmp_path / "run"
    result, _ = run(evidence_config(files, out))
    evals, meta = read_parquet(out / EVAL_NAME)
    audits = read_parquet(out / AUDIT_NAME)[0]
    assert sorted(set(evals["step"])) == [0, 2, 3]  # step 0, every 2, and the last
    assert sorted(set(audits["step"])) == [0, 1, 2, 3] and set(audits["seed"]) == {0, 1}
    family = evals[evals["level"] == "family"]
    assert set(family["family"]) == {"math"} and set(family["k"]) == {1, 2}
    assert (family["problems"] == 5).all() and family["trained"].all()
    assert family["pass_at_k"].between(0, 1).all() and (family["pass_at_k"] > 0).any()
    assert audits[["b_shared", "b_dir", "b_norm"]].stack().between(1 / 3, 1).all()
    log = result.log
    for column in ("grad_norm_rl", "grad_norm_reg", "skipped_fraction", "audit_b_shared"):
        assert column in log.columns, column
    assert (
        list(log.columns).index("audit_b_shared") == list(log.columns).index("b_shared_before") + 1
    )
    assert (log["grad_norm_reg"] > 0).all() and log["skipped_fraction"].between(0, 1).all()
    for step in (1, 2, 3):  # beside b_shared_before: measured at the same weights
        at = audits.loc[audits["step"] == step - 1, "b_shared"].mean()
        assert log.loc[log["step"] == step, "audit_b_shared"].item() == at
    assert meta["audit_disjoint"] is True
    training, audit = set(meta["training_probe_items"]), set(meta["audit_probe_items"])
    assert len(training) == 6 and audit and training.isdisjoint(audit)
    assert meta["eval_untrained_families"] == [] and meta["eval_contamination"]
    record = read_training_probe(out / "final")
    assert set(record["training_probe_items"]) == training and record["regularizer"] == "cdrft"
    assert result.eval is not None and len(result.audit) == len(audits)


def test_in_training_evidence_equals_the_commands_on_the_saved_model(
    files, tmp_path, odd_verifier
) -> None:
    """The last step's eval and audit rows are what ``cdscope eval`` and ``cdscope
    decompose --probe-split audit`` measure on OUT/final with the same settings."""
    out = tmp_path / "run"
    run(evidence_config(files, out))
    evals = read_parquet(out / EVAL_NAME)[0]
    result = invoke("eval", "--model", out / "final", "--tasks", files["eval"], "--n", 3,
                    "--k", "1,2", "--max-new-tokens", 4, "--seed", 0, "--device", "cpu",
                    "--out", tmp_path / "e")  # fmt: skip
    assert result.exit_code == 0, result.output
    passk = pd.read_parquet(tmp_path / "e" / "passk.parquet")
    # per problem: the same samples, so the same passes (paired comparisons use these)
    problems = read_parquet(out / EVAL_PROBLEMS_NAME)[0]
    samples = pd.read_parquet(tmp_path / "e" / "samples.parquet")
    theirs = samples.groupby("problem_id")["passed"].agg(["size", "sum"])
    ours = problems[problems["step"] == 3].set_index("problem_id")
    assert sorted(ours.index) == sorted(theirs.index) and set(problems["step"]) == {0, 2, 3}
    assert (ours["samples"] == theirs["size"].reindex(ours.index)).all()
    assert (ours["correct"] == theirs["sum"].reindex(ours.index)).all()
    last = evals[evals["step"] == 3]
    for level, family in (("domain", "math"), ("overall", "")):
        theirs = passk[(passk["level"] == level) & (passk["domain"] == family)]
        ours = last[last["level"] == ("family" if level == "domain" else "overall")]
        assert ours.sort_values("k")["pass_at_k"].tolist() == pytest.approx(
            theirs.sort_values("k")["pass_at_k"].tolist(), abs=0
        )
    decomposed = invoke("decompose", "-m", out / "final", "--probe", files["pool"],
                        "--probe-split", "audit", "--seeds", 2, "--n", 2, "--device", "cpu",
                        "--out", tmp_path / "d.parquet", "--bootstrap", 0)  # fmt: skip
    assert decomposed.exit_code == 0, decomposed.output
    per_seed = pd.read_parquet(tmp_path / "d.parquet")
    audits = read_parquet(out / AUDIT_NAME)[0]
    final = audits[audits["step"] == 3].set_index("seed")
    pairs = (
        ("B_shared_C", "b_shared"), ("B_dir", "b_dir"), ("B_norm", "b_norm"),
        ("B_shared_C_unbiased", "b_shared_unbiased"), ("gram_negative_mass", "gram_negative_mass"),
    )  # fmt: skip
    for measure, column in pairs:
        got = per_seed[per_seed["measure"] == measure].set_index("seed")["value"]
        for seed in (0, 1):
            assert final.loc[seed, column] == pytest.approx(got.loc[seed], rel=1e-5), measure


def test_evidence_does_not_change_what_the_run_trains(files, tmp_path, odd_verifier) -> None:
    with_evidence, m1 = run(evidence_config(files, tmp_path / "a"))
    without, m2 = run(config(files, tmp_path / "b", steps=3, save_every=1))
    for (name, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    drop = [*TIMING_COLUMNS, "audit_b_shared"]
    pd.testing.assert_frame_equal(
        with_evidence.log.drop(columns=drop), without.log.drop(columns=drop), check_exact=True
    )
    assert without.log["audit_b_shared"].isna().all() and without.eval is None
    assert not (tmp_path / "b" / EVAL_NAME).exists()
    assert read_parquet(tmp_path / "b" / "log.parquet")[1]["audit_disjoint"] is None


def test_resume_keeps_each_state_once(files, tmp_path, odd_verifier) -> None:
    straight, _ = run(evidence_config(files, tmp_path / "a"))
    run(evidence_config(files, tmp_path / "b"), stop_after=2)
    resumed, _ = run(evidence_config(files, tmp_path / "b"), resume=True)
    for name in (EVAL_NAME, AUDIT_NAME, EVAL_PROBLEMS_NAME):
        a = read_parquet(tmp_path / "a" / name)[0].drop(columns="seconds", errors="ignore")
        b = read_parquet(tmp_path / "b" / name)[0].drop(columns="seconds", errors="ignore")
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    pd.testing.assert_frame_equal(
        straight.log.drop(columns=TIMING_COLUMNS),
        resumed.log.drop(columns=TIMING_COLUMNS),
        check_exact=True,
    )


def test_grpo_arm_logs_zero_regulariser_norm(files, tmp_path) -> None:
    result, _ = run(config(files, tmp_path / "run", steps=1, regularizer="none"))
    assert result.log["grad_norm_reg"].tolist() == [0.0]
    assert result.log["grad_norm_rl"].iloc[0] > 0


@pytest.mark.parametrize("flag", ["eval_every", "audit_every"])
@pytest.mark.parametrize("value", [0, -1, 5])
def test_every_outside_one_to_steps_is_refused(files, tmp_path, flag: str, value: int) -> None:
    cfg = config(files, tmp_path / "run", steps=4, **{flag: value})
    option = "--" + flag.replace("_", "-")
    with pytest.raises(CdscopeError, match=f"{option} is a number of steps between 1 and --steps"):
        run(cfg)
    assert not (tmp_path / "run").exists()


def test_bad_evidence_options_exit_2_in_one_line(files, tmp_path) -> None:
    result = invoke("train", "--tasks", files["tasks"], "--probe", files["pool"], "--steps", 2,
                    "--eval-every", 3, "-o", tmp_path / "r")  # fmt: skip
    assert result.exit_code == 2 and "--eval-every is a number of steps" in result.output
    result = invoke("train", "--tasks", files["tasks"], "--probe", files["pool"], "--eval-every",
                    1, "--eval-k", "1,8", "--eval-n", 4, "-o", tmp_path / "r")  # fmt: skip
    assert result.exit_code == 2 and "pass@8 needs at least 8 samples" in result.output


def test_audit_probe_equal_to_the_training_probe_is_refused(files, tmp_path) -> None:
    trained = tmp_path / "trained.jsonl"  # exactly the items the training probe draws
    from cdscope.core.probes import draw_probe, load_pool, split_pool

    pool = split_pool(load_pool([files["pool"]]), "train")
    items = {i.id for i in draw_probe(pool, 0, 2)}
    lines = [ln for ln in files["pool"].read_text().splitlines() if ln.split('"')[3] in items]
    trained.write_text("\n".join(lines) + "\n")
    cfg = config(files, tmp_path / "run", audit_every=1, audit_probe=(str(trained),), audit_n=2)
    with pytest.raises(CdscopeError, match="audit probe holds only items of the training probe"):
        run(cfg)


def test_overlapping_audit_probe_warns_and_records_it(files, tmp_path, capsys) -> None:
    cfg = config(files, tmp_path / "run", steps=1, audit_every=1, audit_n=4,
                 audit_probe=(str(files["pool"]),))  # fmt: skip
    run(cfg)
    meta = read_parquet(tmp_path / "run" / "log.parquet")[1]
    assert meta["audit_disjoint"] is False
    assert set(meta["training_probe_items"]) & set(meta["audit_probe_items"])
    err = capsys.readouterr().err
    assert (
        "audit_disjoint is false" in err
        and len([ln for ln in err.splitlines() if "audit_disjoint" in ln]) == 1
    )


def test_contaminated_and_untrained_eval_sets_are_noted(
    files, tmp_path, odd_verifier, capsys
) -> None:
    mixed = tmp_path / "mixed.jsonl"  # the training tasks themselves, plus a new family
    extra = '{"id": "chem/0", "family": "chem", "prompt": "H2O?\\nSolution:\\n", "verifier": "math", "answer": "1"}\n'
    mixed.write_text(files["tasks"].read_text() + extra)
    cfg = config(files, tmp_path / "run", steps=1, eval_every=1, eval_tasks=(str(mixed),),
                 eval_n=1, eval_max_new_tokens=2)  # fmt: skip
    run(cfg)
    meta = read_parquet(tmp_path / "run" / EVAL_NAME)[1]
    assert meta["eval_untrained_families"] == ["chem"]
    assert meta["eval_contamination"]["exact"] == 12
    assert "held-out tasks overlap the training tasks" in capsys.readouterr().err
    evals = read_parquet(tmp_path / "run" / EVAL_NAME)[0]
    family = evals[evals["level"] == "family"].set_index("family")
    assert not family.loc["chem", "trained"].any() and family.loc["math", "trained"].all()


def test_held_out_default_is_the_sibling_eval_split(tmp_path) -> None:
    from cdscope.resources import default_task_dir

    curriculum = default_task_dir() / "curriculum"
    assert heldout_paths([str(curriculum / "train" / "math.jsonl")]) == [
        str(curriculum / "eval" / "math.jsonl")
    ]
    shipped = [Path(p).parent.name for p in heldout_paths([])]
    assert set(shipped) == {"eval"}
    own = write_tasks_file(tmp_path / "mine.jsonl")
    assert heldout_paths([str(own)]) == heldout_paths([])  # no eval sibling: the shipped sets
    assert [due(s, 2, 5) for s in range(6)] == [True, False, True, False, True, True]
    assert not due(0, None, 5)


def test_trl_backend_takes_the_same_evidence(files, tmp_path, odd_verifier) -> None:
    pytest.importorskip("trl", reason="trl not installed: pip install 'cdscope[trl]'")
    cfg = evidence_config(files, tmp_path / "run", steps=2, backend="trl", micro_batch_size=2,
                          eval_every=1)  # fmt: skip
    result, _ = run(cfg)
    audits = read_parquet(tmp_path / "run" / AUDIT_NAME)[0]
    evals = read_parquet(tmp_path / "run" / EVAL_NAME)[0]
    assert sorted(set(audits["step"])) == [0, 1, 2] and sorted(set(evals["step"])) == [0, 1, 2]
    log = result.log
    assert log["skipped_fraction"].tolist() == [0.0, 0.0]  # TRL forwards every row
    for step in (1, 2):
        at = audits.loc[audits["step"] == step - 1, "b_shared"].mean()
        assert log.loc[log["step"] == step, "audit_b_shared"].item() == at
    assert (tmp_path / "run" / "final" / TRAINING_PROBE_FILE).is_file()
    assert not math.isnan(log["grad_norm_reg"].iloc[0]) and np.isfinite(log["grad_norm_rl"]).all()


def test_report_puts_training_and_audit_b_shared_on_one_page(files, tmp_path, odd_verifier) -> None:
    out = tmp_path / "run"
    run(evidence_config(files, out, steps=2))
    page = tmp_path / "report.html"
    result = invoke("report", out, "-o", page)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "held-out evidence" in text and "audit_disjoint: True" in text
    assert text.count("<img") >= 2  # the training curves and the evidence figure
    audits = read_parquet(out / AUDIT_NAME)[0]
    log = read_parquet(out / "log.parquet")[0]
    for step in (0, 1, 2):  # the table's cells, as the terminal shows them
        at = audits.loc[audits["step"] == step, "b_shared"]
        assert f"{100 * at.mean():.2f} ± {100 * at.std(ddof=1) / 2**0.5:.2f}" in text
    assert f"{100 * log['b_shared_after'].iloc[-1]:.2f}" in text
