"""Gates: g = 1 is the ungated model bit for bit; g_k = 0 removes exactly write k (SPEC §1)."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.gating.model import GatedModel
from cdscope.core.models.architecture import architecture_of
from cdscope.errors import CdscopeError
from tests.helpers import ARCHS, VOCAB, tiny_model


def _ids(B: int = 3, T: int = 10, seed: int = 1) -> torch.Tensor:  # noqa: N803
    return torch.randint(0, VOCAB - 50, (B, T), generator=torch.Generator().manual_seed(seed))


def _causal_mask(T: int, dtype: torch.dtype) -> torch.Tensor:  # noqa: N803
    mask = torch.full((T, T), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return mask[None, None]


def llama_by_hand(model, ids: torch.Tensor, removed: set[int]) -> torch.Tensor:
    """Llama arithmetic written out: h += attn(norm(h)); h += mlp(norm(h)), skipping removed writes."""
    inner, T = model.model, ids.shape[1]  # noqa: N806
    h = inner.embed_tokens(ids)
    position_embeddings = inner.rotary_emb(h, torch.arange(T)[None])
    mask = _causal_mask(T, h.dtype)
    for layer_index, layer in enumerate(inner.layers):
        attn, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(h),
            position_embeddings=position_embeddings,
            attention_mask=mask,
        )
        if 2 * layer_index not in removed:
            h = h + attn
        mlp = layer.mlp(layer.post_attention_layernorm(h))
        if 2 * layer_index + 1 not in removed:
            h = h + mlp
    return model.lm_head(inner.norm(h))


def gpt2_by_hand(model, ids: torch.Tensor, removed: set[int]) -> torch.Tensor:
    """GPT-2 arithmetic written out, with learned absolute positions."""
    tr, T = model.transformer, ids.shape[1]  # noqa: N806
    h = tr.wte(ids) + tr.wpe(torch.arange(T)[None])
    mask = _causal_mask(T, h.dtype)
    for layer_index, block in enumerate(tr.h):
        attn = block.attn(block.ln_1(h), attention_mask=mask)[0]
        if 2 * layer_index not in removed:
            h = h + attn
        mlp = block.mlp(block.ln_2(h))
        if 2 * layer_index + 1 not in removed:
            h = h + mlp
    return model.lm_head(tr.ln_f(h))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_unit_gates_reproduce_ungated_logits_exactly(arch: str, attn: str) -> None:
    model, ids = tiny_model(arch, attn), _ids()
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with GatedModel(model) as gm, gm.gating(torch.ones(ids.shape[0], gm.gate_set.K)):
            gated = model(input_ids=ids).logits
    assert torch.equal(reference, gated)


@pytest.mark.parametrize("arch", ARCHS)
def test_gate_set_order_and_count(arch: str) -> None:
    model = tiny_model(arch)
    gm = GatedModel(model)
    L = architecture_of(model).num_layers  # noqa: N806
    assert gm.gate_set.K == 2 * L
    assert gm.gate_set.layers == [k // 2 for k in range(2 * L)]
    assert gm.gate_set.sublayers == ["attn", "mlp"] * L
    assert gm.gate_set.names[:2] == ["L0.attn", "L0.mlp"]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(("arch", "by_hand"), [("llama", llama_by_hand), ("gpt2", gpt2_by_hand)])
def test_zero_gate_removes_exactly_that_write(arch: str, by_hand, attn: str) -> None:
    model, ids = tiny_model(arch, attn, dtype=torch.float64), _ids()
    K = 2 * architecture_of(model).num_layers  # noqa: N806
    with torch.no_grad():
        assert torch.allclose(by_hand(model, ids, set()), model(input_ids=ids).logits, atol=1e-10)
        with GatedModel(model) as gm:
            for k in range(K):
                gates = torch.ones(ids.shape[0], K, dtype=torch.float64)
                gates[:, k] = 0.0
                with gm.gating(gates):
                    gated = model(input_ids=ids).logits
                expected = by_hand(model, ids, {k})
                assert torch.allclose(gated, expected, atol=1e-10), f"gate {k}"
                assert not torch.allclose(gated, model(input_ids=ids).logits, atol=1e-6), (
                    f"gate {k} had no effect"
                )


@pytest.mark.parametrize("arch", ["gemma2", "gpt_neox"])
def test_zero_gate_changes_output_on_special_architectures(arch: str) -> None:
    """Post-norm (Gemma-2) and parallel-residual (NeoX) writes are gated: each zero gate matters."""
    model, ids = tiny_model(arch, "eager", dtype=torch.float64), _ids()
    with torch.no_grad(), GatedModel(model) as gm:
        base = model(input_ids=ids).logits
        for k in range(gm.gate_set.K):
            gates = torch.ones(ids.shape[0], gm.gate_set.K, dtype=torch.float64)
            gates[:, k] = 0.0
            with gm.gating(gates):
                assert not torch.allclose(model(input_ids=ids).logits, base, atol=1e-8)


def test_gemma2_gate_sits_after_the_post_sublayer_norm() -> None:
    """Scaling the gate scales the normed write, so the residual change is linear in g."""
    model, ids = tiny_model("gemma2", "eager", dtype=torch.float64), _ids(B=1)
    seen = {}
    layer = model.model.layers[0]
    handle = layer.register_forward_hook(lambda mod, args, out: seen.__setitem__("out", out))
    pre = model.model.layers[0].register_forward_pre_hook(
        lambda mod, args, kw: seen.__setitem__("in", args[0] if args else kw["hidden_states"]),
        with_kwargs=True,
    )
    try:
        outs = []
        with torch.no_grad(), GatedModel(model) as gm:
            for g in (0.0, 1.0, 2.0):
                gates = torch.ones(1, gm.gate_set.K, dtype=torch.float64)
                gates[:, 1] = 0.0  # keep layer 0's MLP out, isolate the attention write
                gates[:, 0] = g
                with gm.gating(gates):
                    model(input_ids=ids)
                outs.append(seen["out"] - seen["in"])
        assert torch.allclose(outs[2], 2 * outs[1], atol=1e-10)
        assert torch.allclose(outs[0], torch.zeros_like(outs[0]), atol=1e-12)
    finally:
        handle.remove()
        pre.remove()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_per_row_gates_match_separate_forwards(arch: str) -> None:
    model, ids = tiny_model(arch, "sdpa", dtype=torch.float64), _ids(B=3)
    K = 2 * architecture_of(model).num_layers  # noqa: N806
    gates = 1 + 0.3 * torch.randn(
        3, K, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    with torch.no_grad(), GatedModel(model) as gm:
        with gm.gating(gates):
            batched = model(input_ids=ids).logits
        for b in range(3):
            with gm.gating(gates[b : b + 1]):
                single = model(input_ids=ids[b : b + 1]).logits
            assert torch.allclose(batched[b], single[0], atol=1e-10)


def test_hooks_are_removed_even_on_exceptions() -> None:
    model, ids = tiny_model("llama"), _ids()
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with (
            pytest.raises(RuntimeError, match="boom"),
            GatedModel(model) as gm,
            gm.gating(torch.zeros(ids.shape[0], gm.gate_set.K)),
        ):
            raise RuntimeError("boom")
        assert all(not m._forward_hooks for m in model.modules())
        assert torch.equal(model(input_ids=ids).logits, reference)


def test_gate_shape_is_checked() -> None:
    model, ids = tiny_model("llama"), _ids(B=2)
    with GatedModel(model) as gm:
        with pytest.raises(ValueError, match="shape"), gm.gating(torch.ones(2, 3)):
            pass
        with (
            pytest.raises(ValueError, match="gate rows"),
            torch.no_grad(),
            gm.gating(torch.ones(5, gm.gate_set.K)),
        ):
            model(input_ids=ids)


def test_a_model_without_decoder_blocks_is_refused() -> None:
    class Config:
        model_type = "nothing"

    class Fake(torch.nn.Module):
        config = Config()

    with pytest.raises(CdscopeError, match="no list of decoder blocks"):
        GatedModel(Fake())
