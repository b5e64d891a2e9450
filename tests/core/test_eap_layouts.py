"""Fused q/k/v layouts and latent attention in edge attribution (SPEC §6, issue 12).

Twins that do not call ``cdscope.core.eap_layout`` / ``cdscope.core.eap``:
- the column sets come from the model code itself: its own split of a fused output whose
  values are the column indices (Falcon's and Persimmon's ``_split_heads``, GPT-NeoX's
  ``view(..., -1, 3 * head_size).chunk(3)``);
- one path brute force: t * a_u added to the input of ONE path (a column set of the fused
  projection, or the kv_a_proj_with_mqa input of latent attention), dLoss/dt by autograd
  equals -s(u -> v, path).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cdscope.core.eap import edge_scores
from cdscope.core.eap_graph import eap_plan
from cdscope.core.eap_layout import candidate_layouts, confirms, fused_columns
from cdscope.errors import CdscopeError
from cdscope.tools import tiny

#: Falcon's three layouts: per key/value group (new decoder architecture), [q | k | v]
#: with one key/value head (multi-query), per head [q_h | k_h | v_h] (neither)
FALCON = {
    "falcon-new": dict(new_decoder_architecture=True, num_kv_heads=2),
    "falcon-mq": dict(new_decoder_architecture=False, multi_query=True),
    "falcon-mh": dict(new_decoder_architecture=False, multi_query=False),
}


def _model(name: str) -> torch.nn.Module:
    """A float64 coverage model; Falcon variants with their config changes."""
    if name not in FALCON:
        return tiny.tiny_model(name)
    saved = tiny.TWEAKS["falcon"]
    tiny.TWEAKS["falcon"] = {"head_dim": None, **FALCON[name]}
    try:
        return tiny.tiny_model("falcon")
    finally:
        tiny.TWEAKS["falcon"] = saved


def _split_by_model_code(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """q, k, v column indices as the model's own forward splits them."""
    kind = model.config.model_type
    if kind == "gpt_neox":
        attention = model.gpt_neox.layers[0].attention
        width = attention.query_key_value.out_features
        cols = torch.arange(width).view(-1, 3 * attention.head_size)
        return tuple(c.reshape(-1) for c in cols.chunk(3, dim=-1))
    if kind == "falcon":
        attention = model.transformer.h[0].self_attention
        width = attention.query_key_value.out_features
        parts = attention._split_heads(torch.arange(width, dtype=torch.float64).view(1, 1, -1))
    else:  # persimmon
        attention = model.model.layers[0].self_attn
        width = attention.query_key_value.out_features
        parts = attention._split_heads(torch.arange(width, dtype=torch.float64).view(1, 1, -1))
    # Falcon broadcasts its key/value heads to every query head: keep each column once
    return tuple(torch.unique(p.reshape(-1)).long() for p in parts)


@pytest.mark.parametrize("name", ["gpt_neox", "persimmon", *FALCON])
def test_confirmed_columns_are_the_model_codes_split(name: str) -> None:
    model = _model(name)
    plan = eap_plan(model)
    fused = [r for r in plan if r.columns is not None]
    assert len(fused) == model.config.num_hidden_layers
    expected = _split_by_model_code(model)
    for reads in fused:
        assert reads.paths == ("q", "k", "v")
        for got, want in zip(reads.columns, expected, strict=True):
            assert torch.equal(torch.sort(got).values, want)


def test_wrong_layouts_fail_the_check() -> None:
    """Contiguous blocks on per-head NeoX columns move v columns: check (1) fails; q and k
    swapped pass (1) but fail (2); the true layout passes both."""
    model = _model("gpt_neox")
    attention = model.gpt_neox.layers[0].attention
    fused = attention.query_key_value
    q, k, v = _split_by_model_code(model)
    base = _base(model, fused, attention)
    assert confirms(model, fused, attention, (q, k, v), base)
    assert not confirms(model, fused, attention, (k, q, v), base)
    assert not confirms(model, fused, attention, (q, v, k), base)
    blocks = tuple(torch.arange(fused.out_features).chunk(3))
    candidates = candidate_layouts(model, attention, fused)
    assert any(all(torch.equal(a, b) for a, b in zip(c, blocks, strict=True)) for c in candidates)
    assert not confirms(model, fused, attention, blocks, base)


def _base(model, fused, attention):  # noqa: ANN001, ANN202
    from cdscope.core.eap_layout import _output_with_zeroed

    return _output_with_zeroed(model, fused, attention, torch.arange(0), 0)


def test_projections_that_are_not_q_k_v_are_refused() -> None:
    """A norm has no projection width; the MLP's up projection has one (96 = (4 + 2) 16)
    but no layout of it passes the zeroing check."""
    model, attention = _model("gpt_neox"), "gpt_neox.layers.0.attention"
    with pytest.raises(CdscopeError, match="does not have q \\+ k \\+ v columns"):
        fused_columns(model, "gpt_neox.layers.0.input_layernorm", attention, "eap-info: test")
    with pytest.raises(CdscopeError, match="none of its 4 q/k/v column layouts"):
        fused_columns(model, "gpt_neox.layers.0.mlp.dense_h_to_4h", attention, "eap-info: test")


def _row(batch, b: int):  # noqa: ANN001, ANN202
    return batch.input_ids[b, : int(batch.lengths[b])], int(batch.target_start[b])


def _path_loss(model, ids, start, source, norm, reader, cols, t):  # noqa: ANN001, ANN202
    """Mean answer NLL with t * a_u (the output of ``source``) added to the input of one
    path: the ``cols`` columns of the fused ``reader``, or all of ``reader`` (cols None)."""
    store = {}
    handles = [
        source.register_forward_hook(
            lambda m, a, out: store.__setitem__("a", out[0] if isinstance(out, tuple) else out)
        ),
        norm.register_forward_pre_hook(lambda m, a: store.__setitem__("x", a[0])),
    ]
    if cols is None:
        handles.append(
            reader.register_forward_pre_hook(
                lambda m, a: (norm.forward(store["x"] + t * store["a"]), *a[1:])
            )
        )
    else:

        def splice(m, args, out):  # noqa: ANN001, ANN202
            fresh = m.forward(norm.forward(store["x"] + t * store["a"]))
            mask = torch.zeros(out.shape[-1], dtype=torch.bool)
            mask[cols] = True
            return torch.where(mask, fresh, out)

        handles.append(reader.register_forward_hook(splice))
    try:
        logits = model(input_ids=ids[None], use_cache=False).logits[0].double()
    finally:
        for handle in handles:
            handle.remove()
    logp = torch.log_softmax(logits[start - 1 : len(ids) - 1], dim=-1)
    return -logp.gather(1, ids[start:, None]).mean()


def _paths_of(model, name: str, layer: int):  # noqa: ANN001, ANN202
    """(norm, {path: (reader, cols)}) of attention ``layer``, written from the model code."""
    if name == "gpt_neox":
        block = model.gpt_neox.layers[layer]
        q, k, v = _split_by_model_code(model)
        fused = block.attention.query_key_value
        return block.input_layernorm, {"q": (fused, q), "k": (fused, k), "v": (fused, v)}
    block = model.model.layers[layer]  # deepseek_v3
    attn = block.self_attn
    return block.input_layernorm, {
        "q": (attn.q_a_proj, None),
        "kv": (attn.kv_a_proj_with_mqa, None),
    }


@pytest.mark.parametrize("name", ["gpt_neox", "deepseek_v3"])
def test_single_paths_match_brute_force(name: str) -> None:
    model, batch = _model(name), tiny.random_batch()
    result = edge_scores(model, batch)
    index = {edge: e for e, edge in enumerate(result.graph.edges())}
    b = 0
    ids, start = _row(batch, b)
    blocks = model.gpt_neox.layers if name == "gpt_neox" else model.model.layers
    sources = {"emb": model.get_input_embeddings(), "mlp0": blocks[0].mlp}
    if name == "gpt_neox":
        sources["attn0"] = blocks[0].attention
    else:
        sources["attn0"] = blocks[0].self_attn
    norm, paths = _paths_of(model, name, 1)
    scale = np.abs(result.scores[b]).max()
    for up, source in sources.items():
        for path, (reader, cols) in paths.items():
            eap = result.scores[b, index[(up, "attn1", path)]]
            t = torch.zeros((), dtype=torch.float64, requires_grad=True)
            loss = _path_loss(model, ids, start, source, norm, reader, cols, t)
            (exact,) = torch.autograd.grad(loss, t)
            assert abs(eap) > 1e-5 * scale, (up, path)
            np.testing.assert_allclose(
                -eap, exact.item(), rtol=0, atol=2e-6 * scale, err_msg=f"{up} {path}"
            )


def test_falcon_attention_reads_its_own_norm_even_when_both_norms_are_equal() -> None:
    """Freshly initialised ln_attn and ln_mlp give equal outputs; the attention reads
    ln_attn's output tensor itself (its storage), so that is its pre-norm, not ln_mlp."""
    from cdscope.core.models.architecture import architecture_of

    model = _model("falcon-new")
    block = model.transformer.h[0]
    assert torch.equal(block.ln_attn.weight, block.ln_mlp.weight)
    attn, mlp = architecture_of(model).layer_writes(0)
    assert attn.pre_norm == "transformer.h.0.ln_attn" and mlp.pre_norm == "transformer.h.0.ln_mlp"
