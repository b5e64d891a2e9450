"""Brought-in benchmarks stay benchmarks (issue #40, item 2): ``cdscope eval --tasks
gsm8k.jsonl --tasks math.jsonl`` reports two math benchmarks, not one ``math``; each
``--tasks`` file is a benchmark of its own unless its rows name one; the domain is the
mean of its benchmarks and overall the mean of the domains (SPEC §7), in passk.parquet,
the table, the figure and the report; an earlier file is resumed under today's names."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cdscope.io import read_parquet, write_parquet
from cdscope.output.plots import PASSK_DODGE, passk_figure, passk_panels
from cdscope.tasks import load_tasks
from cdscope.tasks.io import benchmark_of, benchmark_sources, load_task_sources
from tests.helpers import invoke

GSM8K = [  # GSM8K's own columns: the reference follows '####'
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3+4=7\n#### 7"},
    {"question": "A box holds 6 eggs. How many eggs in 2 boxes?", "answer": "6*2=12\n#### 12"},
    {"question": "Sam reads 5 pages a day. Pages in 3 days?", "answer": "5*3=15\n#### 15"},
]
MATH = [  # MATH's own columns: the reference is the last \boxed{}
    {"problem": "What is $2^5$?", "solution": "$2^5 = \\boxed{32}$"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def canned(monkeypatch, texts: dict[str, list[str]], sources, calls=None) -> None:  # noqa: ANN001
    """The hf engine answers each problem of ``sources`` with ``texts[id]`` instead of
    sampling (``calls``: the ids it was asked for)."""
    from cdscope.core.engines import Generation, hf

    ids = {t.prompt: t.id for t in load_tasks(list(sources))}

    class Canned(hf.HFEngine):
        def generate(self, requests):  # noqa: ANN001, ANN202
            asked = [ids[r.prompt] for r in requests]
            if calls is not None:
                calls.extend(asked)
            return [Generation(texts[i], [len(t) for t in texts[i]]) for i in asked]

    monkeypatch.setattr(hf, "HFEngine", Canned)


@pytest.fixture
def two_files(tmp_path) -> tuple[Path, Path]:
    return write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K), write_jsonl(tmp_path / "math.jsonl", MATH)


# -- the rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("math/gsm_symbolic/eval/3", "math", {"generator": "gsm_symbolic"}), "math/gsm_symbolic"),
        (("code/HumanEval/42", "code"), "code/HumanEval"),  # the shipped id convention
        (("HumanEval/42", "code"), "code/HumanEval"),  # HumanEval's own ids
        (("gsm8k/7", "math", {"schema": "gsm8k"}, "gsm8k"), "math/gsm8k"),  # as readers name rows
        (("q1", "math", {"benchmark": "aime24"}, "file"), "math/aime24"),  # the row names it
        (("q1", "math", {"benchmark": "math/aime24"}), "math/aime24"),
        (("11", "code", {"schema": "mbpp"}, "mbpp"), "code/mbpp"),  # MBPP's int ids: the file
        (("math/3", "math", None, "mine"), "math/mine"),  # family/N names no benchmark
        (("q17", "logic"), "logic"),  # nothing names one: the family, as before
    ],
)
def test_benchmark_of(args, expected) -> None:
    assert benchmark_of(*args) == expected


def test_each_source_is_named_by_its_file_and_equal_stems_by_their_folder(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    native = {"family": "math", "prompt": "1 + 1 =", "verifier": "math", "answer": "2"}
    paths = [write_jsonl(tmp_path / d / "test.jsonl", [{"id": f"{d}1", **native}]) for d in "ab"]
    paths.append(write_jsonl(tmp_path / "math.jsonl", MATH))
    read = load_task_sources(paths)
    assert benchmark_sources(read) == {"a1": "a/test", "b1": "b/test", "math/0": "math"}
    assert [benchmark_of(t.id, t.family, t.meta, benchmark_sources(read)[t.id])
            for t, _ in read] == ["math/a/test", "math/b/test", "math/math"]  # fmt: skip


# -- eval ----------------------------------------------------------------------------------------
def test_two_brought_in_files_are_two_benchmarks_everywhere(
    tiny_model_dir, tmp_path, monkeypatch, two_files
) -> None:
    gsm8k, math = two_files
    texts = {"gsm8k/0": ["#### 7", "#### 8"], "gsm8k/1": ["#### 12", "#### 12"],
             "gsm8k/2": ["#### 1", "#### 2"], "math/0": ["\\boxed{32}", "\\boxed{32}"]}  # fmt: skip
    canned(monkeypatch, texts, two_files)
    out, plot = tmp_path / "o", tmp_path / "passk.png"
    result = invoke("eval", "--model", tiny_model_dir, "--tasks", gsm8k, "--tasks", math,
                    "--n", 2, "--k", 1, "--out", out, "--plot", plot)  # fmt: skip
    assert result.exit_code == 0, result.output
    passk = read_parquet(out / "passk.parquet")[0].query("subset == 'all' and k == 1")
    bench = passk[passk["level"] == "benchmark"].set_index("benchmark")["pass_at_k"]
    # gsm8k: (1/2 + 1 + 0) / 3 problems; math: 1 problem, both right
    assert bench.to_dict() == pytest.approx({"math/gsm8k": 0.5, "math/math": 1.0})
    domain = passk[passk["level"] == "domain"].set_index("domain")["pass_at_k"]
    assert domain["math"] == pytest.approx(0.75)  # the mean of its benchmarks, not of its
    overall = passk[passk["level"] == "overall"]["pass_at_k"].item()  # 4 problems (0.625)
    assert overall == pytest.approx(0.75)
    table = result.output
    assert "math/gsm8k" in table and "math/math" in table and "math (mean)" in table
    samples = read_parquet(out / "samples.parquet")[0]
    assert set(samples["benchmark"]) == {"math/gsm8k", "math/math"}
    figure = passk_figure(read_parquet(out / "passk.parquet")[0])
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == ["math/gsm8k (3 problems)", "math/math (1 problem)",
                      "math (mean of 2) (4 problems)", "overall (4 problems)"]  # fmt: skip

    report = invoke("report", out, "--out", tmp_path / "r.html")
    assert report.exit_code == 0, report.output
    page = (tmp_path / "r.html").read_text()
    assert "math/gsm8k" in page and "math/math" in page


def test_an_audit_groups_by_the_same_benchmarks(tmp_path, two_files) -> None:
    result = invoke("eval", "--audit", "--tasks", two_files[0], "--tasks", two_files[1],
                    "--out", tmp_path / "a")  # fmt: skip
    assert result.exit_code == 0, result.output
    frame = read_parquet(tmp_path / "a" / "contamination.parquet")[0]
    assert {"math/gsm8k", "math/math"} <= set(frame["benchmark"])


def test_resume_of_a_file_from_before_renames_its_rows_and_samples_nothing(
    tiny_model_dir, tmp_path, monkeypatch, two_files
) -> None:
    """A samples file written when both files were one ``math`` benchmark: its problems
    (same contents) are kept and carry today's benchmark names."""
    texts = {f"gsm8k/{i}": ["#### 7"] for i in range(3)} | {"math/0": ["\\boxed{32}"]}
    canned(monkeypatch, texts, two_files)
    out = tmp_path / "o"
    args = ["eval", "--model", tiny_model_dir, "--tasks", two_files[0], "--tasks", two_files[1],
            "--n", 1, "--k", 1, "--out", out]  # fmt: skip
    assert invoke(*args).exit_code == 0
    samples, meta = read_parquet(out / "samples.parquet")
    write_parquet(samples.assign(benchmark="math"), out / "samples.parquet", meta)  # as before
    calls: list[str] = []
    canned(monkeypatch, texts, two_files, calls)
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert calls == []  # every problem kept
    resumed = read_parquet(out / "samples.parquet")[0]
    assert set(resumed["benchmark"]) == {"math/gsm8k", "math/math"}
    levels = set(read_parquet(out / "passk.parquet")[0].query("level == 'benchmark'")["benchmark"])
    assert levels == {"math/gsm8k", "math/math"}


# -- the figure: equal curves both visible ----------------------------------------------------
def test_models_with_equal_pass_at_k_are_drawn_side_by_side() -> None:
    rows = []
    for model in ("base", "trained"):
        for level, domain, bench in (("benchmark", "math", "math/a"), ("domain", "math", ""),
                                     ("overall", "", "")):  # fmt: skip
            for k, value in ((1, 0.25), (2, 0.5)):
                rows.append(dict(model=model, subset="all", level=level, domain=domain,
                                 benchmark=bench, k=k, pass_at_k=value, problems=4))  # fmt: skip
    passk = pd.DataFrame(rows)
    assert [title for title, _ in passk_panels(passk)] == ["math/a", "overall"]
    figure = passk_figure(passk)
    base, trained = figure.axes[0].get_lines()[:2]
    assert list(base.get_ydata()) == list(trained.get_ydata())  # equal values ...
    ratio = trained.get_xdata() / base.get_xdata()
    assert ratio == pytest.approx([2**PASSK_DODGE] * 2)  # ... drawn apart, both visible
