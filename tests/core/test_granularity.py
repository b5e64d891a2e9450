"""Finer gates (issue 15): heads, experts, neurons against the sublayer gates they split.

Exact consistency: each write is the sum of its units' contributions (bias-free
projections), so the unit columns of dl/dg summed per write equal the sublayer column;
g = 1 stays bit-exact; unit F is the norm of the unit's contribution (direct twin);
autograd unit gradients agree with finite differences.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.control import control_autograd, control_finite_difference
from cdscope.core.gating.model import GatedModel
from cdscope.core.models.discovery import run_probe
from cdscope.errors import CdscopeError
from cdscope.tools import tiny
from tests.helpers import tiny_model, write_pool

MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]
#: bias-free projections with other layouts: DeepSeek-V3 (dense layer 0, shared experts
#: without a gate), Jamba (mixer + MoE), Phi-3 (fused projections)
OTHERS = [
    ("deepseek_v3", "expert"),
    ("deepseek_v3", "neuron"),
    ("jamba", "expert"),
    ("phi3", "neuron"),
]


def _model(arch: str):  # noqa: ANN202
    """float64 random models of coverage's tiny configs (llama: 4 heads of 16, 96 neurons)."""
    return tiny.tiny_model(arch)


def _summed_per_write(result, gate_set) -> np.ndarray:  # noqa: ANN001
    """dl/dg of the unit gates summed over each (layer, sublayer) write -> [M, writes]."""
    keys = list(dict.fromkeys(zip(gate_set.layers, gate_set.sublayers, strict=True)))
    index = {key: i for i, key in enumerate(keys)}
    out = np.zeros((result.dl_dg.shape[0], len(keys)))
    for k, key in enumerate(zip(gate_set.layers, gate_set.sublayers, strict=True)):
        out[:, index[key]] += result.dl_dg[:, k]
    return out


CASES = (
    [("llama", "head"), ("llama", "neuron")]
    + [(arch, g) for arch in MOE for g in ("expert", "neuron")]
    + OTHERS
)


@pytest.mark.parametrize(("arch", "granularity"), CASES)
def test_unit_gradients_sum_to_the_write_gradient(arch: str, granularity: str) -> None:
    model, batch = _model(arch), tiny.random_batch()
    with GatedModel(model) as gm:
        whole = control_autograd(gm, batch)
    with GatedModel(model, granularity=granularity) as gm:
        fine = control_autograd(gm, batch)
        gate_set = gm.gate_set
    assert gate_set.granularity == granularity and gate_set.K > whole.gate_set.K
    np.testing.assert_array_equal(fine.ell, whole.ell)
    summed = _summed_per_write(fine, gate_set)
    np.testing.assert_allclose(summed, whole.dl_dg, rtol=1e-9, atol=1e-12)
    # C is dl/dg / l_m: the same identity holds for C
    np.testing.assert_allclose(
        _summed_per_write(type(fine)(**{**fine.__dict__, "dl_dg": fine.C}), gate_set),
        whole.C,
        rtol=1e-9,
        atol=1e-12,
    )
    assert np.abs(fine.dl_dg).max() > 1e-6  # not vacuous


def test_unit_counts_and_indices() -> None:
    model = _model("llama")
    with GatedModel(model, granularity="neuron") as gm:
        units = gm.gate_set.units
    attn = [u for u in units if u.layer == 0 and u.sublayer == "attn"]
    mlp = [u for u in units if u.layer == 0 and u.sublayer == "mlp"]
    assert [u.unit for u in attn] == [0, 1, 2, 3] and [u.unit for u in mlp] == list(range(96))
    assert [u.index for u in units] == list(range(len(units)))
    with GatedModel(tiny.tiny_model("qwen2_moe"), granularity="expert") as gm:
        moe = [u for u in gm.gate_set.units if u.layer == 0 and u.sublayer == "moe"]
        attn = [u for u in gm.gate_set.units if u.layer == 0 and u.sublayer == "attn"]
    assert [u.unit for u in moe] == [0, 1, 2, 3, 4]  # 4 routed experts + the shared one
    assert [u.unit for u in attn] == [None]  # attention keeps one gate at expert granularity


@pytest.mark.parametrize("arch", ["llama", *MOE, "deepseek_v3", "gpt2", "gpt_neox", "opt"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unit_gates_at_one_are_bit_exact(arch: str, dtype: torch.dtype) -> None:
    """Also GPT-2 (Conv1D projections), GPT-NeoX (parallel, biased), OPT (fc2 is the MLP
    write itself, rows flattened to [B*T, H])."""
    model = _model(arch).to(dtype)
    ids = tiny.random_batch().input_ids
    plain = run_probe(model, ids)
    for granularity in ("neuron", "expert" if arch in (*MOE, "deepseek_v3") else "head"):
        with GatedModel(model, granularity=granularity) as gm:
            ones = torch.ones(ids.shape[0], gm.gate_set.K, dtype=dtype)
            with torch.no_grad(), gm.gating(ones, capture_norms=True):
                gated = model(ids, use_cache=False).logits
        assert torch.equal(gated, plain), granularity


def _direct_unit_norms(model, arch: str, granularity: str, ids) -> dict:  # noqa: ANN001
    """F twin: unit contributions built explicitly (slice @ W_slice^T, w_e f_e(x))."""
    norms: dict = {}
    handles = []
    layers = model.model.layers
    for layer, block in enumerate(layers):
        if granularity == "head":
            proj = block.self_attn.o_proj
            heads = model.config.num_attention_heads

            def hook(m, args, layer=layer, heads=heads):  # noqa: ANN001, ANN202
                x = args[0].unflatten(-1, (heads, -1))
                W = m.weight.unflatten(1, (heads, -1))  # noqa: N806 - [out, heads, hd]
                contrib = torch.einsum("btud,oud->btuo", x, W)
                norms[layer] = contrib.norm(dim=-1)  # [B, T, heads]

            handles.append(proj.register_forward_pre_hook(hook))
        else:  # expert
            experts = block.mlp.experts

            def hook(m, args, layer=layer):  # noqa: ANN001, ANN202
                hidden, index, weights = args
                cols = []
                for e in range(m.num_experts):
                    out = m.forward(hidden, index, weights * (index == e))
                    cols.append(out.norm(dim=-1))
                norms[layer] = torch.stack(cols, -1)  # [N, E]

            handles.append(experts.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return norms


@pytest.mark.parametrize(("arch", "granularity"), [("llama", "head"), ("mixtral", "expert")])
def test_unit_F_is_the_norm_of_the_unit_contribution(arch: str, granularity: str) -> None:
    model = _model(arch)
    ids = tiny.random_batch().input_ids
    direct = _direct_unit_norms(model, arch, granularity, ids)
    with GatedModel(model, granularity=granularity) as gm:
        ones = torch.ones(ids.shape[0], gm.gate_set.K, dtype=torch.float64)
        with torch.no_grad(), gm.gating(ones, capture_norms=True) as cap:
            model(ids, use_cache=False)
        captured = cap.stacked(gm.gate_set.K)  # [B, K, T]
        units = gm.gate_set.units
    for layer, values in direct.items():
        cols = [u.index for u in units if u.layer == layer and u.unit is not None]
        mine = captured[:, cols, :].transpose(1, 2).reshape(values.shape)
        torch.testing.assert_close(mine, values.to(mine.dtype), rtol=1e-9, atol=1e-9)
        assert values.abs().max() > 0


@pytest.mark.parametrize(("arch", "granularity"), [("llama", "head"), ("qwen2_moe", "expert")])
def test_unit_gradients_match_finite_differences(arch: str, granularity: str) -> None:
    model, batch = _model(arch), tiny.random_batch()
    with GatedModel(model, granularity=granularity) as gm:
        fast = control_autograd(gm, batch)
        picked = [u.index for u in gm.gate_set.units if u.unit is not None][:6]
        picked += [u.index for u in gm.gate_set.units if u.unit is not None][-2:]
        slow = control_finite_difference(gm, batch, gates=picked, order=4)
    # fp32 internals of the tiny models (RMSNorm, rotary) limit fd to ~1e-4 (test_control)
    a, b = slow.dl_dg[:, picked], fast.dl_dg[:, picked]
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-3
    np.testing.assert_allclose(slow.F, fast.F, rtol=1e-12)


def test_a_granularity_the_model_lacks_is_one_line() -> None:
    with pytest.raises(CdscopeError, match="no MoE experts"):
        GatedModel(_model("llama"), granularity="expert")
    with pytest.raises(CdscopeError, match="normalised after the sublayer"):
        GatedModel(tiny_model("gemma2"), granularity="head")


def test_result_frame_has_a_nullable_unit_column(tmp_path) -> None:  # noqa: ANN001
    from cdscope.commands.probe import result_frame
    from cdscope.io import read_parquet, write_parquet

    model = tiny.tiny_model("qwen3_moe")
    with GatedModel(model, granularity="expert") as gm:
        result = control_autograd(gm, tiny.random_batch())
    frame = result_frame("m", 0, result)
    assert str(frame["unit"].dtype) == "Int64"
    whole = frame[frame["sublayer"] == "attn"]
    assert (
        whole["unit"].isna().all() and frame.loc[frame["sublayer"] == "moe", "unit"].notna().all()
    )
    back, _ = read_parquet(write_parquet(frame, tmp_path / "f.parquet", {"x": 1}))
    pd.testing.assert_series_equal(back["unit"], frame["unit"])


runner = CliRunner()


def test_cli_refuses_expert_granularity_on_a_dense_model(tiny_model_dir, tmp_path) -> None:  # noqa: ANN001
    pool = write_pool(tmp_path / "pool.jsonl", {"a": 3, "b": 3})
    out = tmp_path / "p.parquet"
    result = runner.invoke(
        app,
        ["probe", "-m", str(tiny_model_dir), "--probe", str(pool), "--granularity", "expert",
         "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [result.output.strip().splitlines()[-1]] and "no MoE experts" in errors[0]
    assert not out.exists()
    bad = runner.invoke(app, ["bshared", "--granularity", "layer", "-o", str(out)])
    assert bad.exit_code == 2 and "--granularity must be one of" in bad.output


def test_large_K_measures_never_form_K_by_K() -> None:
    """300,000 gates: a K x K float64 matrix would need 720 GB."""
    from cdscope.analysis.uncertainty import direction_stability
    from cdscope.commands.audit import decompose_measures

    rng = np.random.default_rng(0)
    mats = {s: rng.standard_normal((3, 300_000)) for s in range(3)}
    values = decompose_measures(["a", "b", "c"], mats[0], np.abs(mats[0]))
    assert 1 / 3 <= values["B_shared_C"] <= 1
    table = direction_stability(mats)
    assert len(table) == 3 and table["gate_angle_deg"].between(0, 90).all()


def test_gate_space_direction_matches_the_K_by_K_twin() -> None:
    """The gate-space angle via M x M Grams equals the one from the K x K matrices."""
    from cdscope.analysis.uncertainty import direction_stability

    rng = np.random.default_rng(1)
    mats = {s: rng.standard_normal((3, 40)) + np.linspace(0, 3, 40) for s in range(4)}
    hs = [m.T @ m / np.trace(m.T @ m) for m in mats.values()]
    v_mean = np.linalg.eigh(np.mean(hs, axis=0))[1][:, -1]
    expected = []
    for h in hs:
        v = np.linalg.eigh(h)[1][:, -1]
        expected.append(np.degrees(np.arccos(min(1.0, abs(v @ v_mean)))))
    got = direction_stability(mats)["gate_angle_deg"].to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.slow
def test_embedded_model_heads_and_neurons_sum_to_sublayers(embedded, tokenizer) -> None:  # noqa: ANN001
    from cdscope.core.batch import encode_probe
    from cdscope.core.probes import draw_probe, load_pool

    items = draw_probe(load_pool(), 0, 1)
    batch = encode_probe(items, embedded.tokenizer, "plain", pad_id=0)
    with GatedModel(embedded.model) as gm:
        whole = control_autograd(gm, batch, 1)
    for granularity, per_layer in (("head", 9 + 1), ("neuron", 9 + 1536)):
        with GatedModel(embedded.model, granularity=granularity) as gm:
            fine = control_autograd(gm, batch, 1)
            gate_set = gm.gate_set
        assert 30 * per_layer == gate_set.K
        summed = _summed_per_write(fine, gate_set)
        np.testing.assert_allclose(summed, whole.dl_dg, rtol=2e-3, atol=1e-4)


def test_bartlett_random_reference_has_the_direct_draws_distribution() -> None:
    """Large-K random reference (G drawn from its Wishart law) against direct X X^T draws
    at the same K: means and spreads agree within their sampling error."""
    from cdscope.analysis import spectral

    K = spectral.BARTLETT_K
    fast = spectral.random_reference(4, K, trials=4000, seed=1)
    assert spectral.random_reference(4, K, trials=4000, seed=1, chunk=7).samples.tolist() == (
        fast.samples.tolist()
    )  # chunking does not change the draws
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 4, K))
    G = np.einsum("tmk,tnk->tmn", X, X)
    ref = np.linalg.eigvalsh(G)[:, -1] / np.einsum("tii->t", G)
    se = np.hypot(fast.std / np.sqrt(4000), ref.std() / np.sqrt(400))
    assert abs(fast.mean - ref.mean()) < 4 * se
    assert abs(fast.std / ref.std() - 1) < 0.2
