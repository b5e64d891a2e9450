"""docs/api.md runs as written: its ```python blocks, in order, in one namespace.

The slow test runs them on the embedded model. The fast test runs the same text with
``cdscope.load_model("smollm2-135m")`` answered by a tiny random Llama directory, so
the page is checked on every test run without the 135M model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import cdscope

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def doc_blocks() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) >= 8, "docs/api.md lost its examples"
    return blocks


def run_doc(directory: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(directory)  # the plots are written to the working directory
    namespace: dict = {"__name__": "docs_api"}
    for index, block in enumerate(doc_blocks()):
        exec(compile(block, f"docs/api.md python block {index}", "exec"), namespace)  # noqa: S102
    return namespace


def check_outputs(namespace: dict, printed: str, directory: Path, name: str) -> None:
    assert f"B_shared(C) of {name}: " in printed
    assert "B_shared(C) of by-hand: " in printed
    assert "refused: probe[0]: missing key(s) target" in printed
    assert "refused: seeds is a count (seeds=3 measures probe seeds 0, 1, 2)" in printed
    passk = namespace["passk"].query("subset == 'all' and k == 1").set_index("level")
    assert set(passk.loc["benchmark", "benchmark"]) == {"math/gsm8k", "math/math"}
    assert passk.loc["domain", "pass_at_k"] == pytest.approx(  # the mean of its benchmarks
        passk.loc["benchmark", "pass_at_k"].mean()
    )
    for figure in ("bshared.png", "decompose.png", "random_ref.png"):
        assert (directory / figure).stat().st_size > 0
    paired = namespace["paired"]
    assert set(paired["model"]) == {"by-hand"} and (paired["n"] == 2).all()
    assert (paired["mean"] == 0).all()  # the same weights by hand and by id: same numbers
    assert 0 < namespace["b_embedded"] <= 1 and namespace["b_mine"] == namespace["b_embedded"]


def test_api_doc_runs_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch, capsys) -> None:
    original = cdscope.load_model

    def load_model(model="smollm2-135m", tokenizer=None, **options):  # noqa: ANN001, ANN202
        if model == "smollm2-135m":
            model = tiny_model_dir
            options.setdefault("name", "smollm2-135m")
        return original(model, tokenizer, **options)

    monkeypatch.setattr(cdscope, "load_model", load_model)
    namespace = run_doc(tmp_path, monkeypatch)
    check_outputs(namespace, capsys.readouterr().out, tmp_path, "smollm2-135m")
    assert namespace["reference"].stats["K"] == 6


@pytest.mark.slow
def test_api_doc_runs_on_the_embedded_model(tmp_path, monkeypatch, capsys) -> None:
    namespace = run_doc(tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    check_outputs(namespace, printed, tmp_path, "smollm2-135m")
    assert namespace["reference"].stats["K"] == 60
    print(printed)  # the page's output, for the record (pytest -s)
