"""Coverage of transformers' causal-LM types (issue 12): docs/architectures.md is the
rendered output of ``cdscope.core.models.coverage``; these tests fail when it is stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cdscope.core.models import coverage

DOC = Path(__file__).resolve().parents[3] / "docs" / "architectures.md"
#: a fast, varied subset re-measured on every run (dense, MoE, MLA, hybrids, post-norm,
#: parallel residual, flattened rows, post-LN refusal, encoder-decoder refusal)
SUBSET = [
    "llama",
    "gpt2",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "olmo2",
    "phi3",
    "falcon",
    "gptj",
    "jamba",
    "bamba",
    "mamba",
    "opt",
    "bert",
    "bart",
]


def _doc_rows() -> dict[str, str]:
    return {
        line.split("|")[1].strip(): line
        for line in DOC.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| type")
    }


def test_doc_lists_every_causal_lm_type_once() -> None:
    assert sorted(_doc_rows()) == coverage.causal_lm_types()


@pytest.mark.parametrize("model_type", SUBSET)
def test_doc_row_is_current(model_type: str) -> None:
    torch.set_num_threads(1)
    [row] = coverage.run([model_type])
    rendered = coverage.render([row]).strip().splitlines()[-1]
    assert _doc_rows()[model_type] == rendered


def test_doc_counts_meet_the_goal_and_match_the_table() -> None:
    rows = _doc_rows()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in rows.values()]
    supported = [c for c in cells if c[1] == "supported"]
    moe = [c for c in supported if "moe" in c[2]]
    hybrid = [c for c in supported if "mixer" in c[2]]
    assert len(supported) >= 80 and len(moe) >= 12 and len(hybrid) >= 4
    header = re.search(
        r"\*\*(\d+) of (\d+) types supported\*\* — (\d+) with MoE blocks, (\d+)", DOC.read_text()
    )
    assert header and tuple(map(int, header.groups())) == (
        len(supported),
        len(cells),
        len(moe),
        len(hybrid),
    )
    eap = re.search(r"eap-info supports (\d+)\.", DOC.read_text())
    assert eap and int(eap.group(1)) == sum(c[4] == "yes" for c in supported)
    for c in supported:  # every supported type passed autograd vs finite differences
        assert re.search(r"C vs FD < 1e-[3-6]", c[5]), c


@pytest.mark.slow
def test_doc_is_the_rendered_full_run() -> None:
    torch.set_num_threads(1)
    assert DOC.read_text() == coverage.render(coverage.run())
