"""The embedded model's cache as a standard checkpoint (issue 37): written the way
``save_pretrained`` writes a tied Llama, loaded by plain transformers with cdscope's own
logits, older caches upgraded in place, and ``cdscope models path``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.models import checkpoint, load_model
from cdscope.core.models.checkpoint import FORMAT, MARKER, build_embedded, save_standard
from tests.helpers import byte_tokenizer, refused

DIGEST = "ab" * 32
IDS = torch.tensor([[3, 17, 42, 99, 5, 250, 7, 64]])


def tied_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def old_form(model: torch.nn.Module, target: Path) -> None:
    """A cache as cdscope wrote it before issue 37 (format 1): ``save_model`` keeps the tied
    storage once as ``lm_head.weight`` with an alias in the metadata; ``architectures``
    null; a marker without a format."""
    target.mkdir(parents=True)
    save_model(model, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["architectures"] = None
    (target / "config.json").write_text(json.dumps(config))
    byte_tokenizer().save_pretrained(target)
    (target / MARKER).write_text(json.dumps({"gguf_sha256": DIGEST}))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def keys(directory: Path) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), "pt") as handle:
        return set(handle.keys())


def assert_standard(directory: Path, reference: torch.Tensor) -> None:
    """Architectures named, the embedding under its own name, tied again at load, and the
    logits of plain transformers and of cdscope's load equal to ``reference`` bit for bit."""
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert "model.embed_tokens.weight" in keys(directory)
    assert "lm_head.weight" not in keys(directory)
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()
    assert torch.equal(logits(plain), reference)
    ours = load_model(str(directory), device="cpu")
    assert torch.equal(logits(ours.model), reference)
    assert json.loads((directory / MARKER).read_text()) == {"gguf_sha256": DIGEST, "format": FORMAT}


def test_the_standard_form_keeps_each_storage_once_under_the_input_name(tmp_path) -> None:
    model = tied_llama()
    state = checkpoint.standard_state_dict(model)
    assert "model.embed_tokens.weight" in state and "lm_head.weight" not in state
    assert len(state) == len(model.state_dict()) - 1  # exactly the tied copy dropped
    untied = LlamaForCausalLM(
        LlamaConfig(**{**model.config.to_dict(), "tie_word_embeddings": False})
    )
    assert "lm_head.weight" in checkpoint.standard_state_dict(untied)
    save_standard(model, byte_tokenizer(), tmp_path / "std", DIGEST)
    assert_standard(tmp_path / "std", logits(model))


def test_an_old_cache_is_upgraded_in_place_without_the_gguf(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CDSCOPE_CACHE", str(tmp_path))
    model = tied_llama(seed=1)
    target = tmp_path / "models" / "smollm2-135m"
    old_form(model, target)
    # the old form is what vLLM misread: no embedding key, no architectures
    assert keys(target) == set(model.state_dict()) - {"model.embed_tokens.weight"}
    assert checkpoint.cache_format(target) == 1

    def no_gguf():  # noqa: ANN202
        raise AssertionError("an upgrade must not dequantise the GGUF again")

    assert build_embedded(None, no_gguf) == target
    assert_standard(target, logits(model))
    assert build_embedded(None, no_gguf) == target  # current: nothing rewritten
    assert not list(tmp_path.joinpath("models").glob(".smollm2-135m*"))  # no temp folder left


def test_a_damaged_or_missing_cache_is_built_from_the_gguf(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CDSCOPE_CACHE", str(tmp_path))
    model = tied_llama(seed=2)
    target = tmp_path / "models" / "smollm2-135m"
    calls = []

    def dequantise():  # noqa: ANN202
        calls.append(1)
        return model, byte_tokenizer(), DIGEST

    build_embedded(None, dequantise)  # absent
    assert calls == [1]
    assert_standard(target, logits(model))
    old_form(model, tmp_path / "old")
    (target / "model.safetensors").write_bytes(b"not safetensors")
    (target / MARKER).write_text(json.dumps({"gguf_sha256": DIGEST}))  # format 1, damaged
    build_embedded(None, dequantise)
    assert calls == [1, 1]
    assert_standard(target, logits(model))
    (target / MARKER).write_text("{not json")  # an unreadable marker: built again
    build_embedded(None, dequantise)
    assert len(calls) == 3


def test_models_path_prints_the_directory_and_refuses_other_names(tmp_path, monkeypatch) -> None:
    from cdscope import embedded

    monkeypatch.setenv("CDSCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv(embedded.ENV, str(tmp_path / "unused.gguf"))  # no install attempted
    model = tied_llama(seed=3)
    target = tmp_path / "models" / "smollm2-135m"
    old_form(model, target)
    result = CliRunner().invoke(app, ["models", "path", "smollm2-135m"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(target)
    assert_standard(target, logits(model))
    refused(CliRunner().invoke(app, ["models", "path", "gpt2"]), "unknown model 'gpt2'")


@pytest.mark.slow
def test_the_embedded_cache_loads_in_plain_transformers_with_cdscopes_logits(embedded) -> None:
    """The real cache (dequantised or upgraded by the ``embedded`` fixture's load)."""
    directory = Path(embedded.source)
    assert json.loads((directory / MARKER).read_text())["format"] == FORMAT
    ids = embedded.tokenizer("What is 2 + 3? Answer:", return_tensors="pt").input_ids
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert plain.config.architectures == ["LlamaForCausalLM"]
    assert "model.embed_tokens.weight" in keys(directory)
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, embedded.model(input_ids=ids).logits)
