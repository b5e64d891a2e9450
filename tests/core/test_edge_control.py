"""Edge-level control (cdscope.core.edge_control) against two slow twins that do not call it:

- (a) node gates: for every upstream node u, the sum over u's outgoing edges of
  dl/dg_e equals dl/dg_u of cdscope.core.control's gate on u's write (family level, same
  batch), and per row d log pi_b / d g for emb + every write (conftest.gate_gradient);
- (b) real edge gates: hooks written here from the Hugging Face Llama code multiply
  a_u by g inside ONE consumer path's input (x_{v,p} = x_v + (g - 1) a_u) for a handful
  of edges, and l_m(g) is differentiated by central finite differences in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cdscope.analysis.spectral import b_shared, cumulative_mass
from cdscope.commands.edge_probe import edges_for_mass
from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.eap_graph import EdgeGraph, edge_count, edge_graph
from cdscope.core.edge_control import control_edges
from cdscope.core.gating.edge import EdgeGateSet
from cdscope.core.gating.model import GatedModel
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.probes import draw_probe, load_pool
from cdscope.errors import CdscopeError
from cdscope.hooks import HookSet, first_tensor
from cdscope.settings.names import EDGE as GRANULARITY
from tests.helpers import byte_tokenizer, gate_gradient, tiny_model, write_pool

ARCHS = ["llama", "gpt2", "qwen2"]
#: Llama-family RMSNorm computes in fp32 even in float64 models (see test_eap.py).
RTOL = {"llama": 2e-6, "qwen2": 2e-6, "gpt2": 1e-12}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "p.jsonl"
    pool = load_pool([write_pool(path, {"a": 5, "b": 5})])
    return encode_probe(draw_probe(pool, seed=0, n=2), byte_tokenizer(), "plain", pad_id=258)


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_model(arch, "sdpa", torch.float64) for arch in ARCHS}


@pytest.fixture(scope="module")
def results(models, batch):
    return {arch: control_edges(model, batch) for arch, model in models.items()}


def _graph(model: torch.nn.Module) -> EdgeGraph:
    return edge_graph(model)


def _by_upstream(graph, values: np.ndarray) -> np.ndarray:
    """``[..., E]`` -> ``[..., U]``: the sum over each upstream node's outgoing edges."""
    out = np.zeros((*values.shape[:-1], len(graph.upstream)))
    for e, u in enumerate(graph.edge_up):
        out[..., u] += values[..., e]
    return out


# -- the gate set and the result ------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_one_gate_per_edge_with_its_endpoints(arch, models, results, batch) -> None:
    result, L = results[arch], models[arch].config.num_hidden_layers  # noqa: N806
    gates = result.gate_set
    assert isinstance(gates, EdgeGateSet) and gates.granularity == GRANULARITY
    assert gates.K == edge_count(L) == result.dl_dg.shape[1] == result.F.shape[1]
    assert [u.unit for u in gates.units] == list(range(gates.K)) == [u.index for u in gates.units]
    assert set(gates.sublayers) == {"edge"}
    for unit, (up, down, path) in zip(gates.units, gates.edges, strict=True):
        assert unit.layer == (L if down == "logits" else int(down.strip("'")[-1]))
        assert up != down and path in ("q", "k", "v", "in")
    assert result.dl_dg.shape == (batch.M, gates.K) and result.families == batch.families
    np.testing.assert_allclose(result.C, result.dl_dg / result.ell[:, None], rtol=1e-15)
    assert 1 / batch.M <= b_shared(result.C_kept()) <= 1


def test_F_is_the_upstream_node_usage(models, results, batch) -> None:
    """F of the edges out of a write node = F of cdscope.core.control's gate on that write."""
    result, graph = results["llama"], _graph(models["llama"])
    with GatedModel(models["llama"]) as gm:
        node = control_autograd(gm, batch)
    writes = graph.edge_up > 0  # upstream k + 1 is gate k; emb has no node gate
    np.testing.assert_allclose(
        result.F[:, writes], node.F[:, graph.edge_up[writes] - 1], rtol=1e-12
    )
    assert np.all(result.F > 0)


# -- (a) consistency with node gates --------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_outgoing_edges_sum_to_the_node_gate_gradient(arch, models, results, batch) -> None:
    result, model = results[arch], models[arch]
    with GatedModel(model) as gm:
        node = control_autograd(gm, batch)
    summed = _by_upstream(_graph(model), result.dl_dg)  # [M, U]: emb, then the writes in gate order
    scale = np.abs(node.dl_dg).max()
    assert scale > 1e-3  # not vacuous
    np.testing.assert_allclose(summed[:, 1:], node.dl_dg, rtol=0, atol=RTOL[arch] * scale)
    np.testing.assert_allclose(result.ell, node.ell, rtol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_per_row_sums_include_the_embedding(arch, models, results, batch) -> None:
    """Per sample: sum of d log pi_b / d g_e over u's edges = d log pi_b / d g_u, emb too
    (conftest.gate_gradient gives -dLoss_b/dg with Loss_b = -log pi_b / T_b)."""
    from tests.helpers import embedding_module

    result, model = results[arch], models[arch]
    tokens = (batch.lengths - batch.target_start).double().numpy()
    expected = gate_gradient(model, batch, embedding_module(model)) * tokens[:, None]
    summed = _by_upstream(_graph(model), result.row_dlogp)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(summed, expected, rtol=0, atol=RTOL[arch] * scale)


# -- (b) real edge gates, finite differences ------------------------------------------
def _gated_family_ell(model, batch, edge: tuple[str, str, str], g: float) -> np.ndarray:
    """l_m with the gate of ``edge`` set to ``g`` (all other edges at 1), for every family.

    Hooks follow the Hugging Face Llama code: the source module's output is a_u; the
    consumer path's input x is replaced by x + (g - 1) a_u, i.e. g_e * a_u + the rest.
    """
    up, down, path = edge
    blocks, store = model.model.layers, {}
    if up == "emb":
        source = model.model.embed_tokens
    else:
        kind = "attn" if up.startswith("attn") else "mlp"
        block = blocks[int(up.removeprefix(kind))]
        source = block.self_attn if kind == "attn" else block.mlp

    def gated(x: torch.Tensor) -> torch.Tensor:
        return x + (g - 1.0) * store["a"]

    def register(hooks: HookSet) -> None:
        hooks.forward(source, lambda m, a, out: store.__setitem__("a", first_tensor(out)))
        if down == "logits":
            hooks.forward_pre(model.model.norm, lambda m, a: (gated(a[0]),))
        elif down.startswith("mlp"):
            norm = blocks[int(down.removeprefix("mlp"))].post_attention_layernorm
            hooks.forward_pre(norm, lambda m, a: (gated(a[0]),))
        else:
            block = blocks[int(down.removeprefix("attn"))]
            norm = block.input_layernorm
            hooks.forward_pre(norm, lambda m, a: store.__setitem__("x", a[0]))
            proj = getattr(block.self_attn, f"{path}_proj")
            hooks.forward_pre(proj, lambda m, a: (norm.forward(gated(store["x"])),))

    with torch.no_grad(), HookSet("edge gate") as hooks:
        register(hooks)
        logp = row_target_logprobs(model, batch, torch.arange(batch.B)).double()
    sums = torch.zeros(batch.M, dtype=torch.float64).index_add_(0, batch.row_family, logp)
    return (sums / batch.family_sizes().double()).numpy()


EDGES = [
    ("emb", "attn1", "k"),
    ("attn0", "attn1", "q"),
    ("mlp0", "attn1", "v"),
    ("emb", "mlp0", "in"),
    ("attn1", "mlp1", "in"),
    ("mlp1", "logits", "in"),
    ("emb", "logits", "in"),
]


def test_edges_match_finite_differences_of_real_edge_gates(models, results, batch) -> None:
    model, result = models["llama"], results["llama"]
    index = {edge: e for e, edge in enumerate(result.gate_set.edges)}
    np.testing.assert_allclose(
        _gated_family_ell(model, batch, EDGES[0], 1.0), result.ell, rtol=1e-12
    )
    h, scale = 1e-2, np.abs(result.dl_dg).max()
    for edge in EDGES:
        f = {k: _gated_family_ell(model, batch, edge, 1.0 + k * h) for k in (-2, -1, 1, 2)}
        fd = (8 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12 * h)
        got = result.dl_dg[:, index[edge]]
        assert np.abs(got).max() > 1e-4 * scale, edge  # a meaningful edge
        np.testing.assert_allclose(got, fd, rtol=0, atol=1e-4 * scale, err_msg=str(edge))
        np.testing.assert_allclose(
            result.C[:, index[edge]], fd / result.ell, rtol=0, atol=1e-4 * np.abs(result.C).max()
        )


# -- batching -------------------------------------------------------------------------
def test_one_row_at_a_time_equals_one_batch(models, results, batch) -> None:
    whole = results["llama"]
    single = control_edges(models["llama"], batch, batch_size=1)
    np.testing.assert_allclose(single.row_dlogp, whole.row_dlogp, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(single.row_logp, whole.row_logp, rtol=1e-12)
    np.testing.assert_allclose(single.F, whole.F, rtol=1e-12)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in models["llama"].modules())


# -- the workflow: Parquet, concentration table, figure -------------------------------
def test_cumulative_mass_and_edge_counts_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    C = rng.standard_normal((3, 40)) * rng.exponential(size=40)  # noqa: N806
    cum = cumulative_mass(C)
    for m in range(3):
        mags = sorted(np.abs(C[m]), reverse=True)
        total, running = sum(mags), 0.0
        for r, value in enumerate(mags):
            running += value
            assert cum[m, r] == pytest.approx(running / total, rel=1e-12)
        for q in (0.5, 0.9):
            first = next(r + 1 for r in range(40) if cum[m, r] >= q - 1e-12)
            assert edges_for_mass(C, q)[m] == first
    assert edges_for_mass(np.eye(4), 0.9).tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="all-zero row"):
        cumulative_mass(np.zeros((1, 3)))


def test_edge_probe_writes_parquet_and_figure(tmp_path) -> None:
    import cdscope
    from cdscope.commands.edge_probe import concentration, edge_probe
    from cdscope.core.gating.edge import EDGE_COLUMNS
    from cdscope.io import read_parquet
    from cdscope.output.frames import ProbeSettings

    pool = load_pool([write_pool(tmp_path / "p.jsonl", {"a": 4, "b": 4, "c": 4})])
    loaded = cdscope.load_model(tiny_model("llama"), byte_tokenizer(), name="tiny")
    out, plot = tmp_path / "edges.parquet", tmp_path / "edges.png"
    frame, metadata = edge_probe([loaded], pool, ProbeSettings(seeds=(0, 1), n=2), out, plot)
    back, meta = read_parquet(out)
    L = loaded.num_layers  # noqa: N806
    assert len(back) == 2 * 3 * edge_count(L) and set(EDGE_COLUMNS) <= set(back.columns)
    assert meta["settings"]["granularity"] == "edge" and meta["models"][0]["K"] == edge_count(L)
    assert meta["models"][0]["granularity"] == "edge" and set(meta["drawn"]) == {"0", "1"}
    one = back[(back["seed"] == 0) & (back["family"] == "a")]
    assert one.loc[one["upstream"] == "emb", "downstream"].iloc[0] == "attn0"
    assert plot.stat().st_size > 10_000
    table = concentration(back)
    assert len(table) == 6 and np.all((table["PR"] >= 1) & (table["PR"] <= table["E"]))
    assert np.all(table["edges_50"] <= table["edges_90"])
    C = one.sort_values("gate")["C"].to_numpy()  # noqa: N806
    row = table[(table["seed"] == 0) & (table["family"] == "a")].iloc[0]
    assert row["PR"] == pytest.approx(np.abs(C).sum() ** 2 / (C**2).sum(), rel=1e-12)
    with pytest.raises(CdscopeError, match="autograd"):
        edge_probe([loaded], pool, ProbeSettings(seeds=(0,), estimator="fd"))


@pytest.mark.slow
def test_embedded_model_has_3691_edges_consistent_with_its_node_gates(embedded) -> None:
    from cdscope.api import load_pool as shipped_pool

    batch = encode_probe(draw_probe(shipped_pool(), seed=0, n=1), embedded.tokenizer, "plain")
    result = control_edges(embedded.model, batch)
    assert result.gate_set.K == edge_count(30) == 3691
    with GatedModel(embedded.model) as gm:
        node = control_autograd(gm, batch)
    summed = _by_upstream(_graph(embedded.model), result.dl_dg)[:, 1:]
    # float32, two backward passes summing up to 121 paths in different orders: measured
    # max |difference| = 1.4e-6 of the largest |dl/dg|
    np.testing.assert_allclose(summed, node.dl_dg, rtol=0, atol=2e-5 * np.abs(node.dl_dg).max())
    np.testing.assert_allclose(result.ell, node.ell, rtol=1e-6)


def test_cli_probe_and_bshared_at_edge_granularity(tiny_model_dir, tmp_path) -> None:  # noqa: ANN001
    """``--granularity edge`` is an ordinary probe granularity: the Parquet holds one row per
    (family, edge) with its endpoints, bshared reads it, random-ref takes E from the model,
    and the finite-difference estimator is refused in one line (exit 2)."""
    from typer.testing import CliRunner

    from cdscope.cli import app
    from cdscope.io import read_parquet

    runner = CliRunner()
    pool = write_pool(tmp_path / "pool.jsonl", {"a": 3, "b": 3})
    out = tmp_path / "edges.parquet"
    common = ["-m", str(tiny_model_dir), "--probe", str(pool), "--granularity", "edge"]
    probe = runner.invoke(app, ["probe", *common, "--seeds", "1", "-o", str(out)])
    assert probe.exit_code == 0, probe.output
    frame, meta = read_parquet(out)
    E = meta["models"][0]["K"]  # noqa: N806
    assert edge_count(meta["models"][0]["layers"]) == E and len(frame) == 2 * E
    assert {"upstream", "downstream", "path"} <= set(frame.columns)
    assert frame["upstream"].iloc[0] == "emb" and frame["downstream"].iloc[-1] == "logits"
    audit = runner.invoke(app, ["bshared", "--from", str(out), "-o", str(tmp_path / "b.parquet")])
    assert audit.exit_code == 0, audit.output
    ref = runner.invoke(
        app,
        ["random-ref", "--families", "2", "--trials", "50", "--model", str(tiny_model_dir),
         "--granularity", "edge", "-o", str(tmp_path / "r.parquet")],
    )  # fmt: skip
    assert ref.exit_code == 0, ref.output
    assert read_parquet(tmp_path / "r.parquet")[1]["K"] == E
    fd = runner.invoke(app, ["probe", *common, "--estimator", "fd", "-o", str(tmp_path / "x.pq")])
    assert fd.exit_code == 2 and "only the autograd estimator" in fd.output
    assert not (tmp_path / "x.pq").exists()
