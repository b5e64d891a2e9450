"""Edge attribution (SPEC §6): the graph, the one-backward scores against slow twins, the
statistics (the command end to end is in test_cli_eap.py).

Twins used here, none of which calls ``cdscope.core.eap``:
- (a) the gate gradient of cdscope's GatedModel (plus a scalar on the embedding output):
  sum over u's outgoing edges of s(u -> v) = -dLoss/dg_u;
- (b) a brute force that adds t * a_u to the input of ONE consumer path only (through
  hooks written here from the Hugging Face model code) and differentiates the loss in t,
  by central finite differences and by autograd: dLoss/dt = a_u . dLoss/dx = -s(u -> v).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats as sps

from cdscope.core.batch import encode_probe
from cdscope.core.eap import EdgeGraph, EdgeHooks, edge_count, edge_scores, edge_statistics
from cdscope.core.probes import draw_probe, load_pool
from cdscope.errors import CdscopeError
from cdscope.tools import tiny
from tests.helpers import byte_tokenizer, embedding_module, gate_gradient, tiny_model, write_pool

ARCHS = ["llama", "gpt2", "qwen2"]  # every check
ALL_ARCHS = [*ARCHS, "qwen3", "mistral"]  # the consistency check (a) on every supported one
#: Llama-family RMSNorm runs in fp32 even in a float64 model (forward and backward), so
#: sums taken in a different order agree to ~1e-7 there; GPT-2's LayerNorm is float64.
RTOL = {"llama": 2e-6, "qwen2": 2e-6, "qwen3": 2e-6, "mistral": 2e-6, "gpt2": 1e-12}
#: Finite differences in t: the fp32 norm's rounding (~1e-7 of the loss) over a step
#: h = 1e-2 leaves ~1e-5 of the largest score; in pure float64 the stencil's O(h^4) rules.
FD_TOL = {"llama": 1e-4, "qwen2": 1e-4, "gpt2": 1e-8}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "p.jsonl"
    pool = load_pool([write_pool(path, {"a": 5})])
    return encode_probe(draw_probe(pool, seed=0, n=3), byte_tokenizer(), "plain", pad_id=258)


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_model(arch, "sdpa", torch.float64) for arch in ALL_ARCHS}


@pytest.fixture(scope="module")
def scores(models, batch):
    return {arch: edge_scores(model, batch) for arch, model in models.items()}


# -- the graph --------------------------------------------------------------------------
@pytest.mark.parametrize("L", [1, 2, 3, 7, 28, 30])
def test_edge_count_formula(L: int) -> None:
    graph = EdgeGraph.from_layers(L)
    assert graph.E == edge_count(L) == 4 * L**2 + 3 * L + 1
    assert len(graph.upstream) == 2 * L + 1 and len(graph.consumers) == 4 * L + 1
    assert len(set(graph.edges())) == graph.E


def test_edges_follow_the_dataflow() -> None:
    graph = EdgeGraph.from_layers(28)
    assert graph.E == 3221
    edges = set(graph.edges())
    into = {node: {(u, p) for u, v, p in edges if v == node} for node in graph.nodes}
    assert into["emb"] == set()
    assert into["attn0"] == {("emb", p) for p in "qkv"}
    assert into["mlp0"] == {("emb", "in"), ("attn0", "in")}
    assert ("mlp3", "q") in into["attn4"] and ("attn4", "q") not in into["attn4"]
    assert ("attn4", "in") in into["mlp4"] and ("mlp4", "in") not in into["mlp4"]
    assert len(into["logits"]) == 2 * 28 + 1
    for layer in range(28):
        assert len(into[f"attn{layer}"]) == 3 * (2 * layer + 1)
        assert len(into[f"mlp{layer}"]) == 2 * layer + 2


# -- (a) consistency with the control estimator's gate gradient -----------------------


def _gate_gradient(model: torch.nn.Module, batch) -> np.ndarray:
    """-dLoss_b/dg for [emb, gate 0, ..., gate K-1] per row (see conftest.gate_gradient)."""
    return gate_gradient(model, batch, embedding_module(model))


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_outgoing_edge_sums_equal_minus_gate_gradient(arch, models, batch, scores) -> None:
    result = scores[arch]
    expected = _gate_gradient(models[arch], batch)  # [B, 2L+1], upstream order
    summed = np.zeros_like(expected)
    for b in range(batch.B):
        np.add.at(summed[b], result.graph.edge_up, result.scores[b])
    scale = np.abs(expected).max()
    assert scale > 1e-3  # not vacuous
    np.testing.assert_allclose(summed, expected, rtol=0, atol=RTOL[arch] * scale)
    assert np.isfinite(result.scores).all() and np.all(result.loss > 0)


# -- (b) brute force: perturb one path only -------------------------------------------
@dataclass(frozen=True)
class Sites:
    blocks: Callable
    writes: tuple[str, str]
    attn_norm: str
    mlp_norm: str
    final: Callable


SITES = {
    "llama": Sites(
        lambda m: m.model.layers,
        ("self_attn", "mlp"),
        "input_layernorm",
        "post_attention_layernorm",
        lambda m: m.model.norm,
    ),
    "gpt2": Sites(
        lambda m: m.transformer.h, ("attn", "mlp"), "ln_1", "ln_2", lambda m: m.transformer.ln_f
    ),
}
SITES["qwen2"] = SITES["llama"]


def _perturbed_loss(model, arch, ids, start, edge, t) -> torch.Tensor:
    """Mean NLL of ids[start:] with t * a_u added to the input of one consumer path."""
    up, down, path = edge
    sites, store = SITES[arch], {}
    blocks = sites.blocks(model)
    if up == "emb":
        source = embedding_module(model)
    else:
        kind = "attn" if up.startswith("attn") else "mlp"
        source = getattr(blocks[int(up.removeprefix(kind))], sites.writes[kind == "mlp"])

    def keep(name):
        return lambda m, a, out: store.__setitem__(name, out[0] if isinstance(out, tuple) else out)

    def shifted(m, args):
        return (args[0] + t * store["a"],)

    handles = [source.register_forward_hook(keep("a"))]
    if down == "logits":
        handles.append(sites.final(model).register_forward_pre_hook(shifted))
    elif down.startswith("mlp"):
        block = blocks[int(down.removeprefix("mlp"))]
        handles.append(getattr(block, sites.mlp_norm).register_forward_pre_hook(shifted))
    else:
        block = blocks[int(down.removeprefix("attn"))]
        norm = getattr(block, sites.attn_norm)
        handles.append(norm.register_forward_pre_hook(lambda m, a: store.__setitem__("x", a[0])))
        if arch == "gpt2":  # fused c_attn: swap in this path's third, computed on the shifted input
            third = "qkv".index(path)

            def splice(m, args, out):
                fresh = m.forward(norm.forward(store["x"] + t * store["a"]))
                width = out.shape[-1] // 3
                cols = slice(third * width, (third + 1) * width)
                return torch.cat(
                    [out[..., : cols.start], fresh[..., cols], out[..., cols.stop :]], -1
                )

            handles.append(block.attn.c_attn.register_forward_hook(splice))
        else:
            proj = getattr(block.self_attn, f"{path}_proj")
            handles.append(
                proj.register_forward_pre_hook(
                    lambda m, a: (norm.forward(store["x"] + t * store["a"]),)
                )
            )
    try:
        logits = model(input_ids=ids[None]).logits[0].double()
    finally:
        for handle in handles:
            handle.remove()
    logp = torch.log_softmax(logits[start - 1 : len(ids) - 1], dim=-1)
    return -logp.gather(1, ids[start:, None]).mean()


EDGES = [  # (emb -> attn0) is ~0 on every path: the norm is scale-invariant, see below
    ("emb", "attn1", "k"),
    ("attn0", "attn1", "q"),
    ("emb", "logits", "in"),
    ("attn0", "attn1", "k"),
    ("mlp0", "attn2", "v"),
    ("attn1", "mlp1", "in"),
    ("mlp1", "mlp2", "in"),
    ("attn2", "logits", "in"),
    ("mlp2", "logits", "in"),
]


@pytest.mark.parametrize("arch", ARCHS)
def test_single_edges_match_brute_force(arch, models, batch, scores) -> None:
    model, result = models[arch], scores[arch]
    index = {edge: e for e, edge in enumerate(result.graph.edges())}
    b = 1
    ids = batch.input_ids[b, : int(batch.lengths[b])]
    start = int(batch.target_start[b])
    h = 1e-2 if RTOL[arch] > 1e-9 else 1e-3
    with torch.no_grad():
        base = _perturbed_loss(model, arch, ids, start, EDGES[0], 0.0)
    np.testing.assert_allclose(base.item(), result.loss[b], rtol=1e-6)
    for edge in EDGES:
        eap = result.scores[b, index[edge]]
        with torch.no_grad():  # 4th-order central differences in t
            f = {
                k: _perturbed_loss(model, arch, ids, start, edge, k * h).item()
                for k in (-2, -1, 1, 2)
            }
        fd = (8 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12 * h)
        t = torch.zeros((), dtype=torch.float64, requires_grad=True)
        (exact,) = torch.autograd.grad(_perturbed_loss(model, arch, ids, start, edge, t), t)
        scale = np.abs(result.scores[b]).max()
        assert abs(eap) > 1e-4 * scale, edge  # a meaningful edge
        np.testing.assert_allclose(
            -eap, exact.item(), rtol=0, atol=RTOL[arch] * scale, err_msg=str(edge)
        )
        np.testing.assert_allclose(-eap, fd, rtol=0, atol=FD_TOL[arch] * scale, err_msg=str(edge))


@pytest.mark.parametrize("arch", ARCHS)
def test_incoming_scores_cancel_through_the_scale_invariant_norm(arch, scores) -> None:
    """A consumer path reads norm(x) with x = sum_u a_u; norm(c x) = norm(x) up to its eps,
    so sum_u s(u -> v, p) = -x . dLoss/dx ~ 0: edges into one path cancel (not vacuous:
    the |s| statistics are unaffected). The residual is O(eps / mean x^2)."""
    result = scores[arch]
    for row in result.scores:
        incoming = np.zeros(len(result.graph.consumers))
        np.add.at(incoming, result.graph.edge_cons, row)
        assert np.abs(incoming).max() < 1e-2 * np.abs(row).max()


# -- (d) batching, padding, hooks -----------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batch_of_three_equals_one_at_a_time(arch, models, batch, scores) -> None:
    whole = scores[arch]
    assert len(set(batch.lengths.tolist())) > 1  # the batch is really padded
    single = edge_scores(models[arch], batch, batch_size=1)
    np.testing.assert_allclose(single.scores, whole.scores, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(single.loss, whole.loss, rtol=1e-12)
    np.testing.assert_array_equal(single.n_answer_tokens, batch.lengths - batch.target_start)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hooks_keep_the_forward_and_leave_nothing_behind(arch, models, batch) -> None:
    model = models[arch]
    ids = batch.input_ids[:, : int(batch.lengths.max())]
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with EdgeHooks(model) as hooks:
            hooked = model(input_ids=ids).logits
            assert all(a is not None for a in hooks.activations)
            assert all(x is not None for x in hooks.path_inputs)
    torch.testing.assert_close(hooked, plain, rtol=1e-12, atol=1e-12)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_unsupported_architectures_are_refused_with_a_reason() -> None:
    """CodeGen's qkv_proj is laid out as 4 model-parallel chunks of [q | v | k]: neither
    contiguous nor per-head [q | k | v] groups, so no layout passes the zeroing check."""
    with pytest.raises(CdscopeError, match="none of its .* layouts .* passes the zeroing check"):
        EdgeHooks(tiny.tiny_model("codegen"))


#: layouts beyond the ordinary q/k/v decoder (issue 12), from the coverage configs:
#: post-norm-only blocks (OLMo-2), parallel with a shared norm (GPT-J), MoE, fused GQA
#: [q | k | v] (Phi-3) and multi-query [q | k | v] (GPTBigCode), interleaved fused q/k/v
#: (GPT-NeoX per head, Falcon per key/value group), latent attention read through (q, kv)
#: (DeepSeek-V3; MiniCPM3 with a residual multiplier), hybrids whose mixers read through
#: one path (Jamba, Bamba, Falcon-H1 with a mixer parallel to the attention,
#: GraniteMoeHybrid with an MoE and a shared MLP on one norm, Qwen3-Next), and the types
#: issue 31 made build
NEW_LAYOUTS = [
    "olmo2",
    "gptj",
    "mixtral",
    "phi3",
    "qwen2_moe",
    "gpt_neox",
    "falcon",
    "gpt_bigcode",
    "deepseek_v3",
    "minicpm3",
    "jamba",
    "bamba",
    "falcon_h1",
    "granitemoehybrid",
    "qwen3_next",
    # issue 31: configs that build now (xLSTM's mixers, Kimi's delta attention + MoE,
    # LFM2's convolutions + MoE, Dots-1, Youtu's latent attention, Cohere-Compass's
    # parallel residual)
    "xlstm",
    "kimi_linear",
    "lfm2_moe",
    "dots1",
    "youtu",
    "cohere_compass_text",
]


@pytest.mark.parametrize("model_type", NEW_LAYOUTS)
def test_outgoing_sums_equal_minus_gate_gradient_on_new_layouts(model_type: str) -> None:
    """Twin (a) on float64 coverage models, h_0 gated at the token embeddings (after the
    learned positions are added, where there are some)."""
    model, batch = tiny.tiny_model(model_type), tiny.random_batch()
    result = edge_scores(model, batch)
    learned = hasattr(getattr(model, "transformer", None), "wpe")
    expected = gate_gradient(
        model, batch, model.transformer.drop if learned else model.get_input_embeddings()
    )
    summed = np.zeros_like(expected)
    for b in range(batch.B):
        np.add.at(summed[b], result.graph.edge_up, result.scores[b])
    scale = np.abs(expected).max()
    assert scale > 1e-3
    np.testing.assert_allclose(summed, expected, rtol=0, atol=2e-6 * scale)


def test_latent_attention_reads_through_q_and_kv() -> None:
    """DeepSeek-V3: two paths per attention node, E = sum_l [2(2l+1) + (2l+2)] + 2L + 1
    = 3L^2 + 3L + 1 (L = 2: 19)."""
    graph = EdgeHooks(tiny.tiny_model("deepseek_v3")).graph
    assert graph.E == 3 * 2**2 + 3 * 2 + 1 == 19
    assert [p for node, p in graph.consumers if node == "attn1"] == ["q", "kv"]


def test_a_norm_shared_inside_a_block_means_one_input() -> None:
    """GraniteMoeHybrid: the MoE and the shared MLP both read post_attention_layernorm, so
    the shared MLP does not read the MoE's write (no moe0 -> mlp0 edge)."""
    graph = EdgeHooks(tiny.tiny_model("granitemoehybrid")).graph
    into = {(u, v) for u, v, _ in graph.edges()}
    assert ("mixer0", "moe0") in into and ("mixer0", "mlp0") in into
    assert ("moe0", "mlp0") not in into and ("moe0", "mixer1") in into


# -- statistics -----------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation")
def test_edge_statistics_match_their_definitions() -> None:
    rng = np.random.default_rng(0)
    s = rng.standard_normal((4, 46)) * rng.exponential(size=46)
    got = edge_statistics(s)
    for i, row in enumerate(np.abs(s)):
        p = row / row.sum()
        assert got["intensity"][i] == pytest.approx(row.mean())
        assert got["info_complexity"][i] == pytest.approx(-(p * np.log(p)).sum() / np.log(46))
        z = (row - row.mean()) / row.std()
        assert got["kurtosis"][i] == pytest.approx((z**4).mean())
    uniform = edge_statistics(np.ones((1, 10)) * [[1] * 5 + [-1] * 5])
    assert uniform["info_complexity"][0] == pytest.approx(1.0)
    spike = edge_statistics(np.eye(1, 50))
    assert spike["info_complexity"][0] == pytest.approx(0.0, abs=1e-12)
    assert spike["kurtosis"][0] == pytest.approx(sps.kurtosis(np.eye(1, 50)[0], fisher=False))


# -- the stand-in verifier -----------------------------------------------------------
def test_answer_extraction_and_verification() -> None:
    from cdscope.commands.eap_info import extract_answer, scored_text, verifiable
    from cdscope.core.probes import ProbeItem

    math = ProbeItem("m/1", "math", "q", "t", extra={"answer": "-7", "verifier": "math"})
    logic = ProbeItem(
        "l/1", "logic", "q", "t", extra={"answer": "Luke is an altruist, and Emily is an egoist"}
    )
    code = ProbeItem("c/1", "code", "q", "t", extra={"answer": "f", "verifier": "code"})
    assert verifiable(math) and verifiable(logic) and not verifiable(code)
    assert not verifiable(ProbeItem("x/1", "x", "q", "t"))
    assert extract_answer("no statement here") is None
    text = "Computing 1 - 8 = -7.\nThe answer is -7.\nQuestion: more text"
    assert extract_answer(text) == ("-7", "Computing 1 - 8 = -7.\nThe answer is -7.")
    assert scored_text(math, text) == "Computing 1 - 8 = -7.\nThe answer is -7."
    assert scored_text(math, "the answer is  -7") == "the answer is  -7"
    assert scored_text(math, "The answer is 7.") is None
    assert scored_text(math, "The answer is 3.5.\n") is None
    assert extract_answer("The answer is 3.5.\n")[0] == "3.5"
    assert scored_text(logic, "So: The answer is luke is an altruist,  and Emily is an EGOIST.")
