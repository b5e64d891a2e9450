"""Checks on the embedded SmolLM2-135M (slow: the first run dequantises the GGUF, ~40 s)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd, control_finite_difference
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import architecture_of, load_model
from cdscope.core.models.float64 import float64_throughout
from cdscope.core.probes import draw_probe, load_pool

pytestmark = pytest.mark.slow


def test_embedded_model_loads_from_cache_quickly(embedded) -> None:
    start = time.perf_counter()
    again = load_model()
    assert (
        time.perf_counter() - start < 30
    )  # generous: the target (<= 5 s) is measured in benchmarks/
    assert again.revision == embedded.revision and again.revision.startswith("gguf-sha256:")
    assert again.model.config.model_type == "llama" and again.num_layers == 30


def test_unit_gates_are_exact_on_the_embedded_model(embedded) -> None:
    batch = encode_probe(draw_probe(load_pool(), 0, 1), embedded.tokenizer)
    ids = batch.input_ids[:1, : int(batch.lengths[0])]
    with torch.no_grad(), GatedModel(embedded.model) as gm:
        reference = embedded.model(input_ids=ids).logits
        with gm.gating(torch.ones(1, gm.gate_set.K)):
            assert torch.equal(embedded.model(input_ids=ids).logits, reference)


def test_autograd_C_matches_finite_differences_on_the_embedded_model() -> None:  # noqa: N802
    """float64 throughout (no float32 RMSNorm), the seed-0 math item (108 tokens: the
    shortest family; all three took 4 min on a busy CPU), 4 gates, fourth-order
    differences at h = 1e-3 (it was float32 RMSNorm rounding / h ~ 1e-4 under a 1e-3
    bound)."""
    loaded = load_model(dtype="float64")
    batch = encode_probe(draw_probe(load_pool(), 0, 1, ["math"]), loaded.tokenizer)
    gates = [0, 1, 30, 59]
    with float64_throughout(), GatedModel(loaded.model) as gm:
        fast = control_autograd(gm, batch, batch_size=1)
        slow = control_finite_difference(gm, batch, step=1e-3, batch_size=1, order=4, gates=gates)
    a, f = fast.C[:, gates], slow.C[:, gates]
    # floor 7.9e-9 at 1 and 2 threads; 126x margin
    assert np.linalg.norm(a - f) / np.linalg.norm(f) < 1e-6
    assert np.isnan(slow.C[:, 2]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_embedded_model_is_proven_with_all_60_writes(embedded, dtype) -> None:
    """Issue 24: in bfloat16 a search in the model's dtype found 50 of the 60 writes (the
    attention writes of layers 0-9 fit inside its rounding); searched on float32 copies of
    one block at a time, all 60 are found and proven in the model's own dtype, and the C
    row of the seed-0 math item points where float32's does (one short family: float16
    runs emulated on this CPU)."""
    loaded = load_model(dtype=dtype)
    arch = architecture_of(loaded.model)
    reference = architecture_of(embedded.model)
    assert [w.path for w in arch.writes] == [w.path for w in reference.writes] and arch.K == 60
    assert arch.proof.dtype == dtype and arch.proof.zero_gates_error == 0.0
    batch = encode_probe(draw_probe(load_pool(), 0, 1, ["math"]), loaded.tokenizer)
    with GatedModel(loaded.model) as gm, GatedModel(embedded.model) as gm32:
        half = control_autograd(gm, batch, batch_size=1).C
        full = control_autograd(gm32, batch, batch_size=1).C
    cosine = (half * full).sum(1) / np.linalg.norm(half, axis=1) / np.linalg.norm(full, axis=1)
    # floor 0.99865 (bfloat16), 0.999953 (float16) at 1 and 2 threads; 7x margin on 1 - cos
    assert cosine.min() > 0.99


def test_discovery_and_proof_on_the_embedded_model(embedded) -> None:
    """K = 60 in the old order (attn, mlp per layer) on the modules the table used to name;
    discovery + proof costs a few short forwards of the whole model (counted, not timed: a
    wall-clock bound failed under load; 4 measured, the target <= 1 s on an idle CPU is in
    the issue report)."""
    from cdscope.core.models import architecture

    architecture._CACHE.pop(embedded.model, None)
    forwards: list[int] = []
    hook = embedded.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        arch = architecture.architecture_of(embedded.model)
    finally:
        hook.remove()
    assert arch.K == 60 and all(arch.roles(layer) == ("attn", "mlp") for layer in range(30))
    assert [w.path for w in arch.writes[:2]] == ["model.layers.0.self_attn", "model.layers.0.mlp"]
    assert 1 <= len(forwards) <= 6, forwards
