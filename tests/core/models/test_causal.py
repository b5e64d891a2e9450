"""Check 4 of the load proof (cdscope.core.models.causal): a model whose earlier logits see
later tokens is refused at load, in one line, before any number is computed on it."""

from __future__ import annotations

import json

import pytest
import torch

from cdscope.core.models import causal
from cdscope.core.models.architecture import architecture_of
from cdscope.errors import CdscopeError
from cdscope.tools import tiny
from tests.helpers import invoke, refused, tiny_model


def test_a_causal_model_moves_its_earlier_logits_by_nothing() -> None:
    proof = architecture_of(tiny_model("llama")).proof
    assert proof.causal_error == 0.0  # a causal mask adds exact zeros (measured: 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpm_ant_sees_later_tokens_and_is_refused_in_every_dtype(dtype) -> None:
    """CPM-Ant's causal-LM forward marks every position as context: attention both ways.
    Its earlier logits move by 0.82 of their scale (measured, float32), 800x LEAK."""
    model = tiny.tiny_model("cpmant").to(dtype)
    with pytest.raises(CdscopeError, match="cpmant: proof failed: changing the last 3 of 6"):
        architecture_of(model)


def _mix_positions_inside_the_mlp(model, weight: float) -> None:  # noqa: ANN001
    """The first MLP's output gains the mean over all positions: still exactly the write
    the proof's checks 1-3 see (the gate sits on that output), but no longer causal."""

    def hook(module, args, output):  # noqa: ANN001, ANN202
        return output + weight * output.mean(dim=1, keepdim=True)

    model.model.layers[0].mlp.register_forward_hook(hook)


def test_a_write_that_mixes_positions_passes_checks_1_to_3_and_fails_check_4() -> None:
    model = tiny_model("llama")
    _mix_positions_inside_the_mlp(model, 0.5)
    with pytest.raises(CdscopeError, match="not causal") as info:
        architecture_of(model)
    assert "\n" not in str(info.value)


def test_a_leak_under_the_bound_is_not_one() -> None:
    """The bound is LEAK of the logits' scale (about 1 here): a mix a million times weaker
    than the one above moves the earlier logits by 3.0e-7 (measured), seen and let pass."""
    model = tiny_model("llama")
    _mix_positions_inside_the_mlp(model, 5e-7)
    moved = architecture_of(model).proof.causal_error
    assert 0.0 < moved < causal.LEAK / 100


def test_the_tail_change_keeps_ids_in_the_vocabulary_and_changes_every_tail_token() -> None:
    ids = torch.tensor([[1, 5, 9, 3, 9, 8]])
    changed, head = causal.changed_tail(ids, vocab=10)
    assert head == 3
    assert changed.tolist() == [[1, 5, 9, 4, 1, 9]]  # 9 wraps to 1: [1, vocab - 1]


def test_inspect_refuses_a_saved_bidirectional_checkpoint_in_one_line(tmp_path) -> None:
    directory = tiny.save_checkpoint(tiny.tiny_model("cpmant"), tmp_path / "cpmant")
    refused(invoke("inspect", "--model", directory), "not causal")


def test_inspect_reports_the_causal_move(tmp_path) -> None:
    directory = tiny.save_checkpoint(tiny.tiny_model("llama"), tmp_path / "llama")
    result = invoke("inspect", "--model", directory, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["proof"]["causal_error"] == 0.0


def test_nan_from_the_changed_tokens_is_named_non_finite_not_a_leak() -> None:
    """NaN != NaN would read as a move of the earlier logits: it is named for what it is."""
    from cdscope.core.models.discovery import probe_ids

    model = tiny_model("llama")
    ids = probe_ids(model, torch.device("cpu"))
    changed, head = causal.changed_tail(ids, model.config.vocab_size)
    with torch.no_grad():
        model.get_input_embeddings().weight[changed[0, head]] = float("nan")
    with pytest.raises(CdscopeError, match="non-finite|NaN") as info:
        architecture_of(model)
    assert "not causal" not in str(info.value) and "causality check" in str(info.value)
