"""Absurd inputs end in one line naming the magnitude, before any work (issue #26):
weights scaled past float32's range, generation lengths past any model's."""

from __future__ import annotations

import json

import pytest
import torch

from cdscope.tools.tiny import save_checkpoint
from tests.helpers import invoke, refused, tiny_model


def test_absurdly_scaled_weights_are_named_not_blamed_on_the_architecture(tmp_path, pool_file):
    """Weights x 1e30: RMSNorm's square overflows float32 and every write comes out 0,
    which read as 'not a residual decoder block'; the line now names the magnitude."""
    model = tiny_model("llama")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e30)
    huge = save_checkpoint(model, tmp_path / "huge")
    out = tmp_path / "p.parquet"
    line = refused(invoke("probe", "-m", huge, "-p", pool_file, "--n", 1, "-o", out),
                   "absurdly scaled", "|h| = ")  # fmt: skip
    assert "not a residual decoder block" not in line and not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("eval", "--max-new-tokens", "99999999999999999999"),
        ("eap-info", "--max-new-tokens", "99999999999999999999"),
        ("train", "--max-new-tokens", "99999999999999999999", "--steps", 1),
    ],
)
def test_absurd_generation_lengths_are_refused_before_any_work(
    args, tiny_model_dir, pool_file, tmp_path
) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "math/a/0", "family": "math", "prompt": "1+1=",
                                 "verifier": "math", "answer": "2"}) + "\n")  # fmt: skip
    out = tmp_path / "out"
    target = ["--out-dir", out] if args[0] == "train" else ["-o", out]
    inputs = {"eval": ["--tasks", tasks, "-m", tiny_model_dir],
              "eap-info": ["-p", pool_file, "-m", tiny_model_dir],
              "train": ["--tasks", tasks, "--probe", pool_file, "--model", tiny_model_dir]}  # fmt: skip
    line = refused(invoke(*args, *inputs[args[0]], *target), "--max-new-tokens")
    assert "1,000,000" in line or "1000000" in line, line
    assert not out.exists()
