"""The meanings the coverage page gives measured refusals (``coverage.EXPLAINED``), each
measured again here on a tiny model of its type, so that a transformers release that
changes the model makes this fail instead of leaving a stale explanation."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from cdscope.tools import coverage, tiny


@pytest.mark.parametrize(
    ("decoder", "config_type"),
    [
        ("MusicgenForCausalLM", "musicgen_decoder"),
        ("MusicgenMelodyForCausalLM", "musicgen_melody_decoder"),
    ],
)
def test_musicgen_rows_of_a_sample_are_one_stream(decoder: str, config_type: str) -> None:
    """input_ids hold num_codebooks rows per sample, summed into one stream: changing one
    codebook row of sample 0 moves the logits of its other rows, never sample 1's."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        config_type,
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=96,
        num_codebooks=4,
        pad_token_id=0,
        bos_token_id=1,
    )
    model = getattr(transformers, decoder)(config).eval()
    ids = torch.randint(2, 60, (8, 7))  # 2 samples x 4 codebooks
    changed = ids.clone()
    changed[1] = torch.randint(2, 60, (7,))
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert (before[0] - after[0]).abs().max() > 1e-3  # measured 2.5e-2
    assert torch.equal(before[4:], after[4:])
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", ["gemma4_assistant", "gemma4_unified_assistant"])
def test_gemma4_drafters_need_the_target_models_states(model_type: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    assert "shared_kv_states" in inspect.signature(cls.forward).parameters
    with pytest.raises(ValueError, match="producing a cache is different"):
        tiny.tiny_model(model_type)
    row = coverage.check_type(model_type)
    assert row.status == "refused" and row.note.startswith("a speculative-decoding drafter")


def test_xglm_fails_in_float64_only_through_a_float32_factory() -> None:
    """The float64 forward overflows in ``torch.full`` without a dtype; with float64 as
    torch's default dtype the same forward runs: the cause the page names."""
    model = tiny.tiny_model("xglm")
    ids = torch.randint(3, tiny.VOCAB, (1, 6))
    with pytest.raises(RuntimeError, match="cannot be converted to type float without overflow"):
        model(input_ids=ids)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.isfinite(model(input_ids=ids).logits).all()
    finally:
        torch.set_default_dtype(previous)


def test_gemma3n_needs_timm_and_decodes_with_gemma3n_text() -> None:
    import importlib.util

    assert importlib.util.find_spec("timm") is None  # else the row would be measured
    assert tiny.tiny_config("gemma3n").get_text_config().model_type == "gemma3n_text"
    assert coverage.check_type("gemma3n").note.startswith("the multimodal Gemma-3n")


def test_an_explanation_leads_only_the_refusal_it_explains() -> None:
    needle, meaning = coverage.EXPLAINED["xglm"]
    assert coverage.explained("xglm", f"x: {needle}").startswith(meaning)
    assert coverage.explained("xglm", "some other failure") == "some other failure"
    assert coverage.explained("llama", needle) == needle
