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


def test_prophetnet_logits_read_the_first_predicting_stream() -> None:
    """The decoder's hidden state holds the main stream and ``ngram`` predicting streams on
    the sequence axis; the LM head reads the predicting streams of the last block's output
    (no final norm) and the logits are the first one's."""
    model = tiny.tiny_model("prophetnet")
    ngram, batch, length = model.config.ngram, 2, 6
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str):  # noqa: ANN202
        def hook(module, args, output) -> None:  # noqa: ANN001
            seen[key] = (args[0] if key == "head" else output[0]).detach()

        return hook

    model.lm_head.register_forward_hook(keep("head"))
    model.prophetnet.decoder.layers[-1].register_forward_hook(keep("block"))
    with torch.no_grad():
        logits = model(input_ids=torch.randint(3, tiny.VOCAB, (batch, length))).logits
    block, head = seen["block"], seen["head"]
    assert ngram == 2 and block.shape[1] == (1 + ngram) * length
    assert torch.equal(head.reshape(batch, ngram * length, -1), block[:, length:])
    assert torch.equal(logits, model.lm_head(head[:, 0]).detach())
    assert not torch.equal(block[:, :length], block[:, length : 2 * length])
    row = coverage.check_type("prophetnet")
    assert row.status == "refused" and row.note.startswith("the decoder of ProphetNet's")
    assert "feed_forward_layer_norm inside the block" in row.note  # measured: post-LN


class _RevNet(torch.nn.Module):
    """Reformer's coupling on two plain linear sublayers: Y1 = X1 + f(X2), Y2 = X2 + g(Y1)
    (``couple=False``: the second half is returned unchanged)."""

    def __init__(self, couple: bool = True) -> None:
        super().__init__()
        self.f, self.g, self.couple = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), couple

    def forward(self, prev_attn_output, hidden_states):  # noqa: ANN001, ANN201
        y1 = prev_attn_output + self.f(hidden_states)
        y2 = hidden_states + self.g(y1) if self.couple else hidden_states
        return y1, y2


def _block_trace(block: torch.nn.Module, *halves: torch.Tensor):  # noqa: ANN202
    from cdscope.core.models import discovery as d

    trace, hooks, block = d.BlockTrace(), [], block.double()
    hooks.append(block.register_forward_hook(d.block_io_hook(trace), with_kwargs=True))
    d.record_modules(block, "layers.0", d.MAX_DEPTH, trace, [0], hooks)
    with torch.no_grad():
        block(prev_attn_output=halves[0], hidden_states=halves[-1])
    for hook in hooks:
        hook.remove()
    return trace


def test_a_reversible_block_is_named_and_a_plain_second_output_is_not() -> None:
    from cdscope.core.models import diagnosis

    torch.manual_seed(0)
    x1, x2 = torch.randn(1, 5, 8, dtype=torch.float64), torch.randn(1, 5, 8, dtype=torch.float64)
    why = diagnosis.reversible(_block_trace(_RevNet(), x1, x2), "layers.0.", torch.float64)
    assert why is not None and why.startswith("a reversible residual")
    assert "(f, g; g reads the half f wrote)" in why
    # the first block of Reformer: both halves are the embeddings (X1 = X2)
    same = diagnosis.reversible(_block_trace(_RevNet(), x1, x1), "layers.0.", torch.float64)
    assert same == why
    # a second tensor of the stream's shape that the block does not update is no half-stream
    plain = _block_trace(_RevNet(couple=False), x1, x2)
    assert len(plain.outs) == 2 and diagnosis.reversible(plain, "layers.0.", torch.float64) is None


def test_reformer_is_refused_as_reversible_and_gives_gates_no_gradient() -> None:
    """Before the reversible check, discovery fitted the visible half alone (K = 2, one
    feed_forward write a layer) and the proof passed on it, in float32 and float64."""
    from cdscope.core.models.architecture import architecture_of
    from cdscope.errors import CdscopeError

    model = tiny.tiny_model("reformer")
    assert model.lm_head.decoder.in_features == 2 * model.config.hidden_size  # [Y1, Y2]
    with pytest.raises(CdscopeError, match="a reversible residual .*attention, feed_forward"):
        architecture_of(model)
    gate = torch.ones((), dtype=torch.float64, requires_grad=True)
    grad_on: list[bool] = []

    def gated(module, args, output):  # noqa: ANN001, ANN202
        grad_on.append(torch.is_grad_enabled())
        return output._replace(hidden_states=output.hidden_states * gate)

    handle = model.reformer.encoder.layers[0].attention.register_forward_hook(gated)
    try:
        logits = model(input_ids=torch.randint(3, tiny.VOCAB, (1, 8))).logits
    finally:
        handle.remove()
    assert grad_on == [False]  # the layer runs its sublayers under torch.no_grad
    assert torch.autograd.grad(logits.sum(), gate, allow_unused=True) == (None,)
    embeddings = model.reformer.embeddings.word_embeddings.weight
    with pytest.raises(AssertionError, match="model.train"):  # the custom backward
        torch.autograd.grad(logits.sum(), embeddings)
    row = coverage.check_type("reformer")
    assert row.status == "refused" and row.note.startswith("reversible residual layers")


def test_xlnet_attends_to_later_tokens_and_runs_no_query_stream() -> None:
    model = tiny.tiny_model("xlnet")
    assert model.config.attn_type == "bi"
    second: list = []
    model.transformer.layer[0].register_forward_hook(lambda m, a, o: second.append(o[1]))
    ids = torch.randint(3, tiny.VOCAB, (1, 6))
    changed = ids.clone()
    changed[0, -1] = 3 if ids[0, -1] != 3 else 4
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert (before[:, :-1] - after[:, :-1]).abs().max() > 1e-3  # measured 4.3e-2: not causal
    assert second == [None, None]  # the query stream g: only with target_mapping
    row = coverage.check_type("xlnet")
    assert row.status == "refused" and row.note.startswith("a permutation LM")
    assert "ff.layer_norm inside the block" in row.note  # measured: post-LN


def test_cpm_ant_marks_every_position_as_context_and_attends_both_ways() -> None:
    """Changing only the last token moves the first position's logits (measured: by 2.0e-2
    of their scale, float64; a causal model moves them by 0), and the refusal row carries
    the meaning."""
    model = tiny.tiny_model("cpmant")
    ids = torch.tensor([[5, 9, 13, 17, 21, 25]])
    changed = ids.clone()
    changed[0, -1] = 30
    with torch.no_grad():
        first = model(input_ids=ids).logits[0, 0]
        moved = (model(input_ids=changed).logits[0, 0] - first).abs().max()
    assert moved > 2e-3 * first.abs().max()  # 10x under the measured move
    needle, meaning = coverage.EXPLAINED["cpmant"]
    assert coverage.check_type("cpmant").note.startswith(meaning)
