"""Checkpoints whose saved config is a text sub-config AutoModelForCausalLM does not map
(Emu3's ``Emu3TextConfig``, Mllama's ``MllamaTextConfig``): loaded by the class their
``config.json`` names (``loading.causal_lm``), then measured like any other (issue 31)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from cdscope.core.models.architecture import architecture_of
from cdscope.core.models.loading import load_model
from cdscope.tools import tiny
from tests.helpers import invoke, refused


def test_auto_class_alone_cannot_load_an_emu3_text_checkpoint_but_cdscope_does(tmp_path) -> None:
    directory = tiny.save_checkpoint(tiny.tiny_model("emu3"), tmp_path / "emu3")
    assert json.loads((directory / "config.json").read_text())["architectures"] == [
        "Emu3ForCausalLM"
    ]
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_pretrained(directory)
    loaded = load_model(str(directory), device="cpu", dtype="float32")
    assert type(loaded.model).__name__ == "Emu3ForCausalLM"
    arch = architecture_of(loaded.model)
    assert arch.K == 4 and arch.proof.unit_gates_exact


def test_a_layer_that_does_not_run_on_text_is_refused_in_one_line(tmp_path) -> None:
    """Mllama's cross-attention layers (here layer 1 of 2) run only with image states."""
    directory = tiny.save_checkpoint(tiny.tiny_model("mllama"), tmp_path / "mllama")
    line = "layer 1: the block does not run in a forward on token ids alone"
    refused(invoke("inspect", "--model", directory), line)
