"""Expert routing held in the perturbed forwards of the fd twin and the first-order
regulariser (cdscope.core.routing, issue 36).

The six tiny MoE checkpoints are saved with save_pretrained and loaded by path in float64
(eager attention and experts), the user path. Each model seed below was chosen so that,
without the hold, both checks fail on this probe (measured before the hold existed, main at
8c0e8d6: C off by 0.26-2.7 relative, folded cosine 0.31-0.76); held, C is within 1.9e-4 of
autograd (worst of model seeds 0-4 per type at 1 thread; bound 1e-3) and the folded
gradient's cosine with the exact one is 1.000000 (bound 0.999).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd, control_finite_difference
from cdscope.core.gating.model import GatedModel
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.architecture import architecture_of
from cdscope.core.models.loading import load_model
from cdscope.core.probes import draw_probe, load_pool
from cdscope.core.regularizer import exact_grad, fidelity, regularizer_grad
from cdscope.core.routing import RoutingHold, moe_blocks
from cdscope.settings import DEFAULT_EPS, DEFAULT_ESTIMATOR, ProbeSettings
from cdscope.tools import tiny
from tests.helpers import invoke, refused, write_pool

#: model seed per type at which this probe crosses routing switches (module doc)
CROSSING = {"mixtral": 2, "qwen2_moe": 0, "qwen3_moe": 2, "olmoe": 0, "deepseek_v3": 4, "jamba": 4}
DEFAULT_STEP = ProbeSettings.__dataclass_fields__["fd_step"].default


@pytest.fixture(scope="module")
def pool_path(tmp_path_factory) -> Path:
    return write_pool(
        tmp_path_factory.mktemp("pool") / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}
    )


def _saved(model_type: str, seed: int, folder: Path):  # noqa: ANN202
    """The tiny checkpoint loaded by path in float64 (eager), and the probe's batch."""
    directory = tiny.save_checkpoint(tiny.tiny_model(model_type, seed), folder / model_type)
    return load_model(str(directory), device="cpu", dtype="float64", attn="eager")


def _batch(loaded, pool_path: Path):  # noqa: ANN001, ANN202
    return encode_probe(draw_probe(load_pool([pool_path]), 0, 3), loaded.tokenizer, pad_id=258)


def _checks(gm: GatedModel, batch) -> tuple[float, float, object, object]:  # noqa: ANN001
    """C's relative error (fd at the default step vs autograd), the default estimator's
    cosine with the exact gradient, and the two routing counts."""
    fast = control_autograd(gm, batch)
    slow = control_finite_difference(gm, batch, DEFAULT_STEP)
    error = float(np.linalg.norm(slow.C - fast.C) / np.linalg.norm(fast.C))
    approx = regularizer_grad(gm, batch, DEFAULT_ESTIMATOR, DEFAULT_EPS)
    return error, fidelity(approx, exact_grad(gm, batch))["cosine"], slow.routing, approx.routing


@pytest.mark.parametrize("model_type", sorted(CROSSING))
def test_fd_and_folded_gradient_hold_routing_on_saved_moe_checkpoints(
    model_type, pool_path, tmp_path, monkeypatch
) -> None:
    loaded = _saved(model_type, CROSSING[model_type], tmp_path)
    batch = _batch(loaded, pool_path)
    with GatedModel(loaded.model) as gm:
        error, cosine, fd_routing, reg_routing = _checks(gm, batch)
        assert error <= 1e-3 and cosine >= 0.999
        # the perturbations did cross switches, and every one was held
        assert fd_routing.switched > 0 and reg_routing.switched > 0
        assert fd_routing.unheld == reg_routing.unheld == 0
        # decisions: one per MoE block and real token of each perturbed row (2K settings x B
        # rows for fd, 2B rows for the folded estimator)
        tokens = int(batch.lengths.sum()) * len(moe_blocks(loaded.model, gm.architecture))
        assert fd_routing.decisions == 2 * gm.gate_set.K * tokens
        assert reg_routing.decisions == 2 * tokens
        # the same checks without the hold fail on this probe: the test is not vacuous
        monkeypatch.setattr(RoutingHold, "perturbed", lambda self, batch, rows: nullcontext())
        error, cosine, _, _ = _checks(gm, batch)
        assert error > 1e-2 and cosine < 0.99


def test_switch_count_equals_a_forward_by_forward_comparison(pool_path, tmp_path) -> None:
    """Slow twin of ``switched`` on Mixtral (one top-k per router): run each perturbed row
    of fd without the hold, read the experts every router picks at each real token, and
    count the tokens whose set differs from the g = 1 forward's."""
    loaded = _saved("mixtral", CROSSING["mixtral"], tmp_path)
    batch = _batch(loaded, pool_path)
    model = loaded.model
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    picked: list[torch.Tensor] = []
    handles = [r.register_forward_hook(lambda m, a, out: picked.append(out[2])) for r in routers]

    def choices(gm: GatedModel, gates: torch.Tensor, row: int) -> list[torch.Tensor]:
        picked.clear()
        rows = torch.tensor([row])
        with torch.no_grad(), gm.gating(gates[None]):
            row_target_logprobs(model, batch, rows)
        return [p.sort(dim=-1).values for p in picked]

    try:
        with GatedModel(model) as gm:
            K = gm.gate_set.K  # noqa: N806
            held = control_finite_difference(gm, batch, DEFAULT_STEP).routing
            expected = 0
            for b in range(batch.B):
                nominal = choices(gm, torch.ones(K, dtype=torch.float64), b)
                for k in range(K):
                    for sign in (1.0, -1.0):
                        gates = torch.ones(K, dtype=torch.float64)
                        gates[k] += sign * DEFAULT_STEP
                        for a, n in zip(choices(gm, gates, b), nominal, strict=True):
                            expected += int((a != n).any(dim=-1).sum())
    finally:
        for handle in handles:
            handle.remove()
    assert expected > 0 and held.switched == expected


def test_rows_are_held_whatever_their_grouping(pool_path, tmp_path) -> None:
    """The nominal forward in one padded batch, the perturbed ones a row at a time or all
    2K settings at once: the same routing is replayed (equal C to rounding)."""
    loaded = _saved("qwen2_moe", CROSSING["qwen2_moe"], tmp_path)
    batch = _batch(loaded, pool_path)
    with GatedModel(loaded.model) as gm:
        one = control_finite_difference(gm, batch, DEFAULT_STEP, batch_size=1)
        whole = control_finite_difference(gm, batch, DEFAULT_STEP, batch_size=None)
    assert one.routing == whole.routing and one.routing.switched > 0
    np.testing.assert_allclose(one.dl_dg, whole.dl_dg, rtol=1e-9, atol=1e-12)


def test_activation_checkpointing_replays_and_counts_once(pool_path, tmp_path) -> None:
    """Under non-reentrant activation checkpointing the backward reruns each block's forward
    inside the same perturbed context: it must see the held routing (same gradient as
    without checkpointing) and not be counted again."""
    loaded = _saved("olmoe", CROSSING["olmoe"], tmp_path)
    batch = _batch(loaded, pool_path)
    model = loaded.model
    with GatedModel(model) as gm:
        plain = regularizer_grad(gm, batch, "folded", DEFAULT_EPS)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        model.train()
        try:
            again = regularizer_grad(gm, batch, "folded", DEFAULT_EPS)
        finally:
            model.eval()
            model.activation_checkpointing_disable()
    assert again.routing == plain.routing and plain.routing.switched > 0
    torch.testing.assert_close(again.flat(), plain.flat(), rtol=1e-9, atol=1e-12)


def test_blocks_are_found_by_module_structure() -> None:
    """Parents of fused experts modules (DBRX: the experts module is the write, its router a
    sibling), sublayers of ``moe`` writes with another experts interface (GPT-OSS), and none
    on a dense model (no hooks: the hold is a no-op)."""
    dbrx = tiny.tiny_model("dbrx")
    assert moe_blocks(dbrx, architecture_of(dbrx)) == [
        "transformer.blocks.0.ffn", "transformer.blocks.1.ffn"
    ]  # fmt: skip
    oss = tiny.tiny_model("gpt_oss")
    assert moe_blocks(oss) == []  # no fused experts interface: found through the architecture
    assert moe_blocks(oss, architecture_of(oss)) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    llama = tiny.tiny_model("llama")
    batch = tiny.random_batch()
    hold = RoutingHold(llama, batch, architecture_of(llama))
    assert not hold
    with GatedModel(llama) as gm:
        assert control_finite_difference(gm, batch, gates=[0]).routing is None


def test_a_router_without_top_k_is_refused_for_fd_with_its_measured_count(
    pool_path, tmp_path
) -> None:
    """PhiMoE's sparsemixer picks experts with max and thresholds: nothing to hold. fd is
    refused with one line giving the decisions its steps changed (exit 2 from the CLI); the
    regulariser reports them as not held instead of stopping a training run."""
    directory = tiny.save_checkpoint(tiny.tiny_model("phimoe", 1), tmp_path / "phimoe")
    result = invoke(
        "probe", "--model", directory, "--probe", pool_path, "--n", 3, "--seeds", 1,
        "--estimator", "fd", "--dtype", "float64", "--out", tmp_path / "p.parquet",
    )  # fmt: skip
    line = refused(result, "cannot hold the expert routing of this phimoe model", "autograd")
    assert " of " in line and not (tmp_path / "p.parquet").exists()
    loaded = load_model(str(directory), device="cpu", dtype="float64", attn="eager")
    with GatedModel(loaded.model) as gm:
        approx = regularizer_grad(gm, _batch(loaded, pool_path), "folded", DEFAULT_EPS)
    assert approx.routing.unheld > 0


def test_a_perturbed_forward_of_an_unrecorded_row_is_an_error() -> None:
    model = tiny.tiny_model("mixtral")
    batch = tiny.random_batch()
    with RoutingHold(model, batch) as hold:
        context = hold.perturbed(batch, torch.tensor([0]))
        with pytest.raises(RuntimeError, match="nominal"):
            context.__enter__()


def test_probe_fd_records_the_routing_it_held(pool_path, tmp_path) -> None:
    """``cdscope probe --estimator fd`` on an MoE checkpoint: the counts per (model, seed)
    in the run metadata (``fd_routing``) and a note on stderr."""
    from cdscope.io import read_parquet

    directory = tiny.save_checkpoint(
        tiny.tiny_model("mixtral", CROSSING["mixtral"]), tmp_path / "m"
    )
    out = tmp_path / "p.parquet"
    result = invoke(
        "probe", "--model", directory, "--probe", pool_path, "--n", 3, "--seeds", 1,
        "--estimator", "fd", "--dtype", "float64", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = read_parquet(out)[1]["fd_routing"][str(directory)]["0"]
    assert record["switched"] > 0 and record["unheld"] == 0 and record["decisions"] > 0
    assert f"{record['switched']} of {record['decisions']} routing decisions" in result.output


def test_fd_order_reaches_the_estimator(tmp_path) -> None:
    """``--fd-order 4`` was parsed but never handed to the estimator (it always ran order 2)."""
    from cdscope.core.granularities import gates_for

    model = tiny.tiny_model("llama")
    batch = tiny.random_batch()
    settings = ProbeSettings(seeds=(0,), estimator="fd", fd_order=4)
    with gates_for(model, settings.granularity) as gates:
        measured = gates.control(batch, settings, None)
        direct = control_finite_difference(gates.gm, batch, settings.fd_step, order=4)
        second = control_finite_difference(gates.gm, batch, settings.fd_step, order=2)
    np.testing.assert_array_equal(measured.dl_dg, direct.dl_dg)
    assert not np.array_equal(measured.dl_dg, second.dl_dg)


def test_a_measurement_handed_over_records_the_routing_itself(pool_path, tmp_path) -> None:
    """Training hands its probe measurement over (no first pass): the estimator then runs
    one forward of its own to record the routing, and takes the same gradient."""
    loaded = _saved("jamba", CROSSING["jamba"], tmp_path)
    batch = _batch(loaded, pool_path)
    with GatedModel(loaded.model) as gm:
        alone = regularizer_grad(gm, batch, "folded", DEFAULT_EPS)
        nominal = control_autograd(gm, batch)  # no routing recorded in it
        handed = regularizer_grad(gm, batch, "folded", DEFAULT_EPS, nominal=nominal)
    assert handed.routing == alone.routing and alone.routing.switched > 0
    torch.testing.assert_close(handed.flat(), alone.flat(), rtol=1e-9, atol=1e-12)


def test_a_router_routing_rows_by_positions_is_held() -> None:
    """Zaya's router takes top-k over ``[rows, width, experts]`` (no flattened token axis):
    held all the same (refused as 'routes 4 tokens in a forward of 4 x 10' before)."""
    model = tiny.tiny_model("zaya")
    batch = tiny.random_batch()
    with GatedModel(model) as gm:
        fast = control_autograd(gm, batch)
        slow = control_finite_difference(gm, batch, DEFAULT_STEP)
    assert np.linalg.norm(slow.C - fast.C) / np.linalg.norm(fast.C) < 1e-3
    assert slow.routing.switched > 0 and slow.routing.unheld == 0
