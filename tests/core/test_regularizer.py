"""The regulariser's gradient (SPEC §5): exact double backward vs finite differences of
R(C(theta)), and the first-order proxies against the exact gradient.

The float64 models here run float64 throughout (``float64_throughout``): transformers'
Llama computes its RMSNorm in float32 even in a float64 model, and that rounding (~6e-8),
divided by a finite-difference step or compared across chunk shapes and thread counts,
set floors of 1e-5 under bounds of 1e-5 (issue 24). The floors written next to the
bounds are the worst of Llama and GPT-2 at 1 and 2 threads."""

from __future__ import annotations

import json

import pytest
import torch

from cdscope.analysis.spectral import moment_ratio, moment_ratio_torch
from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.float64 import float64_throughout
from cdscope.core.probes import draw_probe, load_pool
from cdscope.core.regularizer import (
    check_realised_perturbation,
    check_step_resolution,
    exact_grad,
    fidelity,
    proxy_grad,
)
from cdscope.errors import CdscopeError
from tests.helpers import tiny_model, write_pool


@pytest.fixture(scope="module")
def probe_batch(tmp_path_factory, tokenizer):
    path = write_pool(tmp_path_factory.mktemp("pool") / "p.jsonl", {"a": 3, "b": 3, "c": 3})
    return encode_probe(draw_probe(load_pool([path]), seed=0, n=2), tokenizer, "plain", pad_id=258)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return tiny_model(request.param, "eager", dtype=torch.float64)


def _R_of(model, batch) -> float:  # noqa: N802
    with float64_throughout(), GatedModel(model) as gm:
        return float(moment_ratio(control_autograd(gm, batch).C_kept()))


def test_exact_gradient_matches_finite_differences_of_R(model, probe_batch) -> None:
    with float64_throughout(), GatedModel(model) as gm:
        exact = exact_grad(gm, probe_batch)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(3)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    t = 1e-5  # fourth-order stencil; float64 throughout, rounding ~1e-16 / t stays below
    values = {}
    for step in (2, 1, -1, -2):  # fourth-order stencil: R is strongly curved in theta here
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(step * t * d)
        values[step] = _R_of(model, probe_batch)
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.sub_(step * t * d)
    numeric = (8 * (values[1] - values[-1]) - (values[2] - values[-2])) / (12 * t)
    analytic = sum(float((g * d).sum()) for g, d in zip(exact.grads, direction, strict=True))
    assert analytic == pytest.approx(numeric, rel=1e-7)  # floor 2.4e-10 (gpt2); 400x margin
    assert abs(numeric) > 1e-8
    assert pytest.approx(_R_of(model, probe_batch), rel=1e-12) == exact.R  # floor 2.2e-16


def test_proxy_converges_to_the_exact_gradient(model, probe_batch) -> None:
    with float64_throughout(), GatedModel(model) as gm:
        exact = exact_grad(gm, probe_batch)
        tiny = proxy_grad(gm, probe_batch, eps=1e-4)
        errors = [
            fidelity(proxy_grad(gm, probe_batch, eps=e), exact)["rel_error"] for e in (0.04, 0.02)
        ]
    assert fidelity(tiny, exact)["cosine"] >= 0.9999  # floor 1 - 1.3e-15
    assert 3.5 < errors[0] / errors[1] < 4.5  # O(eps^2): measured 3.998-3.9995
    assert pytest.approx(exact.R, rel=1e-10) == tiny.R  # the same C: measured equal


def test_richardson_cancels_the_eps_squared_term(model, probe_batch) -> None:
    with float64_throughout(), GatedModel(model) as gm:
        exact = exact_grad(gm, probe_batch)
        plain = fidelity(proxy_grad(gm, probe_batch, eps=0.04), exact)["rel_error"]
        better = fidelity(proxy_grad(gm, probe_batch, eps=0.04, richardson=True), exact)[
            "rel_error"
        ]
    assert better < plain / 20  # measured plain / better >= 4680


def test_folded_proxy_converges_to_the_exact_gradient(model, probe_batch) -> None:
    """The folded estimator (normaliser from the measured C̄ and the perturbed passes)
    against its slow twin, the exact double backward: O(eps^2), cosine >= 0.999."""
    with float64_throughout(), GatedModel(model) as gm:
        exact = exact_grad(gm, probe_batch)
        tiny = proxy_grad(gm, probe_batch, eps=1e-4, fold_normaliser=True)
        errors = [
            fidelity(proxy_grad(gm, probe_batch, eps=e, fold_normaliser=True), exact)["rel_error"]
            for e in (0.04, 0.02)
        ]
        richardson = proxy_grad(gm, probe_batch, eps=0.04, richardson=True, fold_normaliser=True)
    assert fidelity(tiny, exact)["cosine"] >= 0.9999  # floor 1 - 3.6e-15
    assert 3.5 < errors[0] / errors[1] < 4.5  # O(eps^2): measured 3.998-3.9995
    assert fidelity(richardson, exact)["rel_error"] < errors[0] / 20  # O(eps^4): 4660x
    assert (tiny.estimator, richardson.estimator) == ("folded", "folded-richardson")


@pytest.mark.parametrize("granularity", ["head", "neuron"])
def test_estimators_take_any_gate_set(model, probe_batch, granularity: str) -> None:
    """CD-RFT at a finer granularity (issue 15, part 5): the estimators only see [B, K]
    gates, so the folded and Richardson proxies converge to the exact gradient of R(C)
    over head / neuron gates as they do over sublayer gates — and that gradient is not the
    sublayer one (R of a different C)."""
    with float64_throughout(), GatedModel(model, granularity=granularity) as gm:
        assert gm.gate_set.K > 2 * 3  # 3 layers: more gates than the 6 writes
        exact = exact_grad(gm, probe_batch)
        folded = proxy_grad(gm, probe_batch, eps=1e-4, fold_normaliser=True)
        richardson = proxy_grad(gm, probe_batch, eps=0.02, richardson=True)
    with float64_throughout(), GatedModel(model) as gm:
        sublayer = exact_grad(gm, probe_batch)
    assert fidelity(folded, exact)["cosine"] >= 0.9999  # floor 1 - 7.8e-16
    assert fidelity(richardson, exact)["cosine"] >= 0.999  # floor 1 - 2e-15
    assert fidelity(sublayer, exact)["cosine"] < 0.99  # measured 0.11-0.99 (gpt2 head 0.988)


def test_folded_normaliser_is_the_exact_coefficient_times_the_mean_gradient(probe_batch) -> None:
    """folded - detached = sum_m -(W_m . C_m) / l_m * sum_o h_o grad l_m(1 + o Ŵ_m), with
    the pieces computed independently (grad l_m at each offset by its own backward)."""
    from cdscope.analysis.spectral import r_sensitivity

    model = tiny_model("gpt2", "eager", dtype=torch.float64)
    eps = 0.03
    with float64_throughout(), GatedModel(model) as gm:
        folded = proxy_grad(gm, probe_batch, eps=eps, fold_normaliser=True)
        detached = proxy_grad(gm, probe_batch, eps=eps, detach_normaliser=True)
        control = control_autograd(gm, probe_batch)
        C = torch.from_numpy(control.C)  # noqa: N806 - every family kept here
        W = torch.from_numpy(r_sensitivity(control.C))  # noqa: N806
        params = [p for p in model.parameters() if p.requires_grad]
        expected = [torch.zeros_like(p) for p in params]
        for m in range(probe_batch.M):
            rows = torch.nonzero(probe_batch.row_family == m).flatten()
            coefficient = -float((W[m] * C[m]).sum()) / float(control.ell[m])
            for offset in (eps, -eps):
                with gm.gating((1 + offset * W[m] / W[m].norm()).repeat(len(rows), 1)):
                    ell = row_target_logprobs(model, probe_batch, rows).mean()
                for acc, g in zip(expected, torch.autograd.grad(ell, params), strict=True):
                    acc.add_(0.5 * coefficient * g)
    assert control.kept.all()
    target = torch.cat([e.reshape(-1) for e in expected])
    error = float(((folded.flat() - detached.flat()) - target).norm() / target.norm())
    assert error < 1e-8, error  # floor 9.0e-12; 1000x margin


class _PassCounter:
    """Counts the rows every forward of ``model`` embeds and the parameter backwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows = self.backwards = 0
        first = next(p for p in model.parameters() if p.requires_grad)
        self._handles = [
            model.get_input_embeddings().register_forward_pre_hook(self._forward),
            first.register_hook(self._backward),
        ]

    def _forward(self, module, args) -> None:  # noqa: ANN001 - args[0]: input ids [rows, T]
        self.rows += int(args[0].shape[0])

    def _backward(self, grad: torch.Tensor) -> None:
        self.backwards += 1

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@pytest.mark.parametrize(
    ("estimator", "richardson", "fold", "passes"),
    [("proxy", False, False, 3), ("richardson", True, False, 5), ("folded", False, True, 2)],
)
def test_pass_count_with_the_measurement_handed_over(
    probe_batch, estimator, richardson, fold, passes
) -> None:
    """Rows of forward + parameter backward per gradient: B per probe pass (batch_size = B:
    one chunk per pass, so one parameter backward per pass)."""
    model = tiny_model("llama", "eager", dtype=torch.float64)
    with float64_throughout(), GatedModel(model) as gm:
        measured = control_autograd(gm, probe_batch)
        counter = _PassCounter(model)
        try:
            result = proxy_grad(
                gm, probe_batch, 0.01, richardson=richardson, fold_normaliser=fold,
                batch_size=probe_batch.B, nominal=measured,
            )  # fmt: skip
        finally:
            counter.close()
    assert result.estimator == estimator
    assert (counter.rows, counter.backwards) == (passes * probe_batch.B, passes)


def test_detached_normaliser_differs_by_exactly_the_normaliser_term(model, probe_batch) -> None:
    """default - detached = sum_m ||W_m|| D_m * grad(1 / l_m) = -sum_m ||W_m|| D_m / l_m^2 grad l_m."""
    eps = 0.01
    with float64_throughout(), GatedModel(model) as gm:
        default = proxy_grad(gm, probe_batch, eps=eps)
        detached = proxy_grad(gm, probe_batch, eps=eps, detach_normaliser=True)
        # the pieces, computed independently: D_m from gated forwards, grad l_m from a plain backward
        from cdscope.analysis.spectral import r_sensitivity

        C = control_autograd(gm, probe_batch)  # noqa: N806
        W = torch.from_numpy(r_sensitivity(C.C))  # noqa: N806
        params = [p for p in model.parameters() if p.requires_grad]
        expected = [torch.zeros_like(p) for p in params]
        for m in range(probe_batch.M):
            rows = torch.nonzero(probe_batch.row_family == m).flatten()
            w_hat = W[m] / W[m].norm()
            ell_pm = []
            for sign in (1, -1):
                with torch.no_grad(), gm.gating((1 + sign * eps * w_hat).repeat(len(rows), 1)):
                    ell_pm.append(float(row_target_logprobs(model, probe_batch, rows).mean()))
            D = (ell_pm[0] - ell_pm[1]) / (2 * eps)  # noqa: N806
            ell = row_target_logprobs(model, probe_batch, rows).mean()
            grad_ell = torch.autograd.grad(ell, params)
            for acc, g in zip(expected, grad_ell, strict=True):
                acc.add_(-float(W[m].norm()) * D / float(ell.detach()) ** 2 * g)
    difference = default.flat() - detached.flat()
    target = torch.cat([e.reshape(-1) for e in expected])
    error = float((difference - target).norm() / target.norm())
    assert error < 1e-9, error  # floor 5.0e-13; 2000x margin
    assert float(target.norm()) > 0


def test_gradients_for_a_parameter_subset(probe_batch) -> None:
    model = tiny_model("llama", "eager", dtype=torch.float64)
    subset = [model.model.layers[0].mlp.down_proj.weight]
    with float64_throughout(), GatedModel(model) as gm:
        full = exact_grad(gm, probe_batch)
        part = exact_grad(gm, probe_batch, params=subset)
    index = [i for i, p in enumerate(model.parameters()) if p is subset[0]][0]
    assert torch.allclose(part.grads[0], full.grads[index])


def test_steps_below_bf16_resolution_are_refused() -> None:
    with pytest.raises(CdscopeError, match="rounded away"):
        check_step_resolution(0.001, torch.bfloat16, richardson=False)
    with pytest.raises(CdscopeError, match="rounded away"):
        check_step_resolution(0.02, torch.bfloat16, richardson=True)
    check_step_resolution(0.05, torch.bfloat16, richardson=True)
    check_step_resolution(1e-4, torch.float32, richardson=True)


def test_realised_gate_perturbation_is_checked_in_the_model_dtype() -> None:
    """The step eps * Ŵ_mk is what the cast to the model dtype must keep, not eps."""
    spread = torch.nn.functional.normalize(torch.linspace(0.3, 1.0, 60)[None].repeat(3, 1), dim=1)
    with pytest.raises(CdscopeError, match=r"change by \d+%.*--dtype float32"):
        check_realised_perturbation((0.05, -0.05), spread, torch.bfloat16)  # passes eps alone
    assert check_realised_perturbation((0.05, -0.05), spread, torch.float32) < 1e-5
    exact = torch.zeros(2, 60)
    exact[:, 0] = 1.0  # 1 +/- 2^-4 is a bf16 number: nothing is lost
    assert check_realised_perturbation((2**-4, -(2**-4)), exact, torch.bfloat16) == 0.0
    assert check_realised_perturbation((0.05,), torch.zeros(3, 60), torch.bfloat16) == 0.0


def test_proxy_on_a_bf16_model_refuses_steps_the_gates_lose(probe_batch) -> None:
    model = tiny_model("llama", "eager", dtype=torch.bfloat16)
    with GatedModel(model) as gm, pytest.raises(CdscopeError, match="cast to bfloat16"):
        proxy_grad(gm, probe_batch, eps=0.05)


def test_exact_gradient_with_sdpa_names_the_fix(probe_batch) -> None:
    model = tiny_model("llama", "sdpa")
    with GatedModel(model) as gm, pytest.raises(CdscopeError, match="--attn eager"):
        exact_grad(gm, probe_batch)


def _exact_grad_whole_graph(gm: GatedModel, batch) -> torch.Tensor:
    """Slow twin of ``exact_grad``: C of the whole probe with ``create_graph``, backward of R."""
    params = [p for p in gm.model.parameters() if p.requires_grad]
    sizes = batch.family_sizes().double()
    gates = torch.ones(batch.B, gm.gate_set.K, dtype=torch.float64, requires_grad=True)
    with gm.gating(gates):
        logp = row_target_logprobs(gm.model, batch, torch.arange(batch.B)).double()
    per_family = torch.zeros(batch.M, dtype=torch.float64).index_add(0, batch.row_family, logp)
    ell = per_family / sizes
    (row_grad,) = torch.autograd.grad(
        (logp / sizes[batch.row_family]).sum(), gates, create_graph=True
    )
    dl_dg = torch.zeros(batch.M, gm.gate_set.K, dtype=torch.float64).index_add(
        0, batch.row_family, row_grad
    )
    R = moment_ratio_torch(dl_dg / ell[:, None])  # noqa: N806
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(R, params)])


@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_chunked_exact_gradient_equals_the_whole_graph_twin(model, probe_batch, batch_size) -> None:
    with float64_throughout(), GatedModel(model) as gm:
        twin = _exact_grad_whole_graph(gm, probe_batch)
        chunked = exact_grad(gm, probe_batch, batch_size=batch_size)
    # other chunk shapes and thread counts round differently in float64: floor 5.6e-15
    # (it was 4.2e-8 with Llama's float32 RMSNorm); 1000x margin. A wrong bracket term
    # would be O(1).
    assert float((chunked.flat() - twin).norm() / twin.norm()) < 1e-11


def test_chunked_proxy_equals_the_whole_batch(probe_batch) -> None:
    model = tiny_model("llama", "eager", dtype=torch.float64)
    with float64_throughout(), GatedModel(model) as gm:
        whole = proxy_grad(gm, probe_batch, eps=0.02, richardson=True)
        for size in (1, 4):
            part = proxy_grad(gm, probe_batch, eps=0.02, richardson=True, batch_size=size)
            # exact algebra; what differs is float64 rounding per chunk shape, times the
            # stencil's 1/eps: floor 6.7e-14 (it was 1.15e-5 with Llama's float32 RMSNorm,
            # over the old 1e-5 bound); 1000x margin. Dropping a chunk's term would be O(1).
            error = (part.flat() - whole.flat()).norm() / whole.flat().norm()
            assert float(error) < 1e-10


def test_gradcheck_command_on_a_tiny_model(tiny_model_dir, tmp_path) -> None:
    import pandas as pd
    from typer.testing import CliRunner

    from cdscope.cli import app

    pool = write_pool(tmp_path / "pool.jsonl", {"a": 3, "b": 3, "c": 3})
    out = tmp_path / "gc.parquet"
    args = [
        "gradcheck",
        "-m",
        str(tiny_model_dir),
        "-p",
        str(pool),
        "--n",
        "2",
        "--seeds",
        "1",
        "--eps",
        "0.01,0.001",
    ]
    result = CliRunner().invoke(app, [*args, "--dtype", "float64", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    rows = json.loads(result.stdout)["rows"]  # --json: the table's rows
    assert [r["cosine"] for r in rows] == frame["cosine"].tolist()
    assert list(zip(frame["estimator"], frame["eps"], strict=True)) == [
        ("proxy", 0.01),
        ("proxy", 0.001),
        ("folded", 0.01),
        ("folded", 0.001),
    ]
    assert frame["is_default"].tolist() == [False, False, True, False]  # folded at eps 0.01
    assert (frame["cosine"] > 0.999).all()  # floor 1 - 8.8e-9
    assert (frame["rel_error"] < 1e-3).all()  # floor 1.3e-4: eps = 0.01's O(eps^2); 7x


@pytest.mark.parametrize("estimator", ["exact", "proxy", "richardson", "folded"])
def test_a_measurement_handed_over_replaces_the_first_pass(probe_batch, estimator) -> None:
    from cdscope.core.control import control_autograd
    from cdscope.core.regularizer import regularizer_grad

    model = tiny_model("llama", "eager", dtype=torch.float64)
    with float64_throughout(), GatedModel(model) as gm:
        own = regularizer_grad(gm, probe_batch, estimator, 0.01)
        measured = control_autograd(gm, probe_batch)
        handed = regularizer_grad(gm, probe_batch, estimator, 0.01, nominal=measured)
    assert torch.equal(own.flat(), handed.flat()) and own.R == handed.R
