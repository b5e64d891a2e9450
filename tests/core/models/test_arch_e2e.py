"""Issue 12's "done when", end to end: tiny random checkpoints of the named architectures,
saved with a tokenizer to a local directory, run through the command line as a user
would: ``inspect --json``, ``probe``, ``bshared`` and ``eap-info``.

Each checkpoint is a coverage config (``cdscope.core.models.tiny.tiny_config``) in float32
with every 1-D parameter (norm weights, biases) drawn at random too, so that norms that
are equal at initialisation (Falcon's ln_attn and ln_mlp) are told apart. Checked:

- inspect: K, the roles per layer (those of tests/core/models/test_architectures.py), the proof,
  the eap paths of every write (q/k/v, q/kv for DeepSeek-V3's latent attention, in);
- probe: C finite, of shape M x K, gates in the inspected roles' order;
- bshared: finite measures, B_shared_C in (0, 1];
- eap-info: one row per sample, E edges, and per node the consistency identity
  sum over u's outgoing edges of mean s(u -> v, p) = mean over samples of -dLoss/dg_u
  (the gate-gradient twin of tests/conftest.py on the same batch, loaded like the CLI).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.batch import encode_probe
from cdscope.core.probes import draw_probe, load_pool
from cdscope.tools import tiny
from tests.helpers import NAMED, gate_gradient, write_pool

TYPES = [*sorted(NAMED), "bamba"]  # eight named types, Jamba and Bamba (hybrids)
ROLES = {**{t: NAMED[t][:2] for t in NAMED}, "bamba": (("mixer", "mlp"), ("mixer", "mlp"))}
N = 2  # items per family
#: float32 checkpoints: fp32 norms and sums in another order agree to ~1e-6 of the scale
ATOL = 2e-5


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _checkpoint(model_type: str, directory: Path) -> Path:
    torch.manual_seed(1)
    model = tiny.tiny_model(model_type)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return tiny.save_checkpoint(model, directory)  # float32, with the byte tokenizer


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return write_pool(tmp_path_factory.mktemp("pool") / "pool.jsonl", {"math": 3, "code": 3})


def _twin(directory: Path, pool: Path) -> np.ndarray:
    """Mean over the eap-info batch of -dLoss/dg for [emb, gate 0, ...] (conftest twin)."""
    from cdscope.core.models import load_model

    loaded = load_model(str(directory))
    items = draw_probe(load_pool([pool]), 0, N, ["math"])
    tok = loaded.tokenizer
    batch = encode_probe(items, tok, pad_id=tok.pad_token_id or 0)
    model = loaded.model
    return gate_gradient(model, batch, model.get_input_embeddings()).mean(axis=0)


@pytest.mark.parametrize("model_type", TYPES)
def test_commands_on_a_local_checkpoint(model_type: str, pool: Path, tmp_path: Path) -> None:
    directory = _checkpoint(model_type, tmp_path / model_type)

    result = invoke("inspect", "--model", directory, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    roles = [tuple(w["role"] for w in layer["writes"]) for layer in record["layers"]]
    assert tuple(roles[:2]) == ROLES[model_type]
    K = record["K"]  # noqa: N806
    assert sum(map(len, roles)) == K and record["proof"]["unit_gates_exact"]
    assert record["eap_info"] == "yes"
    attention = ["q", "kv"] if model_type == "deepseek_v3" else ["q", "k", "v"]
    for w in (w for layer in record["layers"] for w in layer["writes"]):
        assert w["eap_paths"] == (attention if w["role"] == "attn" else ["in"])

    out = tmp_path / "probe.parquet"
    result = invoke("probe", "--model", directory, "--probe", pool, "--n", N, "--out", out)
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    C = frame.pivot(index="family", columns="gate", values="C").to_numpy()  # noqa: N806
    assert C.shape == (2, K) and np.isfinite(C).all() and np.abs(C).max() > 0
    assert frame.groupby("gate")["sublayer"].first().tolist() == [r for rs in roles for r in rs]

    out = tmp_path / "b.parquet"
    result = invoke(
        "bshared", "--model", directory, "--probe", pool, "--seeds", 1, "--n", N, "--out", out
    )
    assert result.exit_code == 0, result.output
    measures = pd.read_parquet(out).set_index("measure")["value"]
    assert set(measures.index) >= {"B_shared_C", "R_C"} and np.isfinite(measures).all()
    assert 0 < measures["B_shared_C"] <= 1

    out = tmp_path / "eap.parquet"
    result = invoke(
        "eap-info", "--model", directory, "--probe", pool, "--family", "math",
        "--n", N, "--use-targets", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    samples = pd.read_parquet(out)
    assert len(samples) == N and np.isfinite(samples[["intensity", "kurtosis"]]).all().all()
    edges = pd.read_parquet(out.with_name("eap.edges.parquet"))
    nodes = list(pd.unique(edges["upstream"]))
    assert len(nodes) == K + 1 and nodes[0] == "emb"
    outgoing = edges.groupby("upstream", sort=False)["mean_score"].sum()[nodes].to_numpy()
    expected = _twin(directory, pool)
    scale = np.abs(expected).max()
    assert scale > 1e-3
    np.testing.assert_allclose(outgoing, expected, rtol=0, atol=ATOL * scale)
