"""Results a reader can read (issue #40, item 5): the bshared figure says which bar is
the paper's B_shared and which is not comparable, and shows what chance gives (the random
reference of the measured M x K) and the --fail-above line; a model goes by one name in
tables, the --fail-above error, the report's FAIL banner and eval legends; the training
figure says why its projection panel is empty; the report's settings read as the options."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import cdscope
from cdscope.analysis.spectral import random_reference
from cdscope.commands.audit_plot import BAND_TRIALS, audit_figure, random_bands
from cdscope.io import read_parquet
from cdscope.output.plots import passk_figure
from cdscope.output.plots_train import train_figure
from cdscope.output.render import short_model_name
from cdscope.output.report_html import setting_name, train_section
from tests.helpers import invoke
from tests.test_faults import probe_file

LONG = "/data/experiments/runs/cdrft/final"  # a model given by an absolute path


def legend_labels(figure) -> list[str]:  # noqa: ANN001
    return [text for ax in figure.axes for text in ax.get_legend_handles_labels()[1]]


# -- the bshared figure ---------------------------------------------------------------------------
def test_the_figure_shows_the_random_reference_and_the_fail_above_line(tmp_path) -> None:
    frame = read_parquet(probe_file(tmp_path / "p.parquet"))[0]  # M = 3 families, K = 4 gates
    result = cdscope.bshared(frame)
    result.metadata["fail_above"] = 55.0  # as run_audit records --fail-above
    figure = audit_figure(result)
    ax = figure.axes[0]
    reference = random_reference(3, 4, BAND_TRIALS, seed=0)
    (band,) = [c for c in ax.collections if c.get_label() == "random 3×4 matrix: mean–p95"]
    low, high = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
    assert (low, high) == pytest.approx((100 * reference.mean, 100 * reference.p95))
    (line,) = [c for c in ax.collections if c.get_label() == "--fail-above 55%"]
    assert {tuple(seg[:, 1]) for seg in line.get_segments()} == {(55.0, 55.0)}
    assert random_bands(result) == {"m": (reference.mean, reference.p95, "3×4")}
    result.metadata.pop("fail_above")  # no --fail-above: no line
    assert "--fail-above 55%" not in legend_labels(audit_figure(result))


def test_plain_and_corrected_bars_say_which_is_the_papers(tiny_model_dir, pool_file) -> None:
    result = cdscope.bshared(tiny_model_dir, probe=pool_file, n=2, progress=False)
    ticks = [t.get_text() for t in audit_figure(result).axes[0].get_xticklabels()]
    assert ticks == ["B_shared(C)\nplain: the paper's",
                     "B_shared(C)\ncorrected\nnot comparable\nwith plain"]  # fmt: skip


# -- one name ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (LONG, "cdrft/final"),
        ("runs/grpo/final/", "grpo/final"),
        ("./runs/base/", "runs/base"),
        ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),  # a hub id is never cut
        ("smollm2-135m", "smollm2-135m"),
        ("runs/cdrft/../base", "runs/base"),
    ],
)
def test_a_model_name_is_shortened_from_its_text_alone(given, shown, tmp_path, monkeypatch):
    assert short_model_name(given) == shown
    monkeypatch.chdir(tmp_path)  # the same whether or not the path exists here
    (tmp_path / "runs" / "base").mkdir(parents=True)
    assert short_model_name(given) == shown


def test_one_model_goes_by_one_name_in_tables_errors_banner_and_legends(tmp_path) -> None:
    source = probe_file(tmp_path / "p.parquet", model=LONG)
    out = tmp_path / "b.parquet"
    result = invoke("bshared", "--from", source, "--fail-above", 1, "-o", out)
    assert result.exit_code == 1, result.output  # the CI gate failed
    error = [line for line in result.output.splitlines() if line.startswith("audit failed:")]
    assert error and "cdrft/final" in error[0] and LONG not in error[0], error
    table_lines = [line for line in result.output.splitlines() if "│" in line]
    assert any("cdrft/final" in line for line in table_lines) and LONG not in result.output
    page = tmp_path / "r.html"
    assert invoke("report", out, "--out", page).exit_code == 1  # the run's verdict: FAIL
    banners = [b.split("</div>", 1)[0] for b in page.read_text().split('class="verdict fail">')]
    (banner,) = [b for b in banners if b.startswith("FAIL: mean")]  # the run's own banner
    assert "cdrft/final" in banner and LONG not in banner
    passk = pd.DataFrame([dict(model=m, subset="all", level=level, domain=d, benchmark=b, k=1,
                               pass_at_k=0.5, problems=2)
                          for m in (LONG, "smollm2-135m")
                          for level, d, b in (("benchmark", "math", "math/x"),
                                              ("domain", "math", ""), ("overall", "", ""))])  # fmt: skip
    assert "cdrft/final" in legend_labels(passk_figure(passk))


# -- the training figure and the report's settings --------------------------------------------------
def log(projections: list[int]) -> pd.DataFrame:
    steps = np.arange(1, len(projections) + 1)
    return pd.DataFrame({"step": steps, "reward": 0.5, "loss": 0.1, "b_shared_before": 0.6,
                         "b_shared_after": 0.55, "r_before": 0.5, "r_after": 0.45,
                         "proj_iters": projections, "step_s": 1.0})  # fmt: skip


def panel_text(figure) -> str:  # noqa: ANN001
    return " ".join(t.get_text() for t in figure.axes[3].texts)


def test_the_projection_panel_says_why_it_is_empty() -> None:
    assert "no projection: --regularizer none" in panel_text(train_figure(log([0, 0]), "none"))
    idle = panel_text(train_figure(log([0, 0]), "cdrft", 70.0))
    assert "no projection ran" in idle and "tau = 70%" in idle
    assert panel_text(train_figure(log([0, 2]), "cdrft", 70.0)) == ""  # bars speak for it


def test_the_report_shows_settings_by_their_option_names(tmp_path) -> None:
    assert setting_name("lam") == "lambda" and setting_name("k_max") == "k-max"
    assert setting_name("not_an_option") == "not_an_option"
    config = {"regularizer": "cdrft", "lam": 0.5, "tau": 70.0, "prompts_per_step": 8}
    html = train_section(tmp_path, {"log": log([1])}, {"config": config}, None)
    assert "<td>lambda</td>" in html and "<td>prompts-per-step</td>" in html
    assert "<td>lam</td>" not in html
