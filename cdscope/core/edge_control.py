"""Control at edge granularity: C over the edges of the layer-level graph (SPEC §2, §6).

Gates. Edge e = (u -> v, p) of ``cdscope.core.eap_graph.EdgeGraph`` gets a gate g_e that
multiplies u's contribution to the input of path p of v:

    x_{v,p} = sum_{u that v reads} g_{(u, v, p)} a_u

so g = 1 is the ungated model and g_e = 0 removes u from that one path. At g = 1

    d log pi / d g_e = sum_{t, d} a_u[t, d] * d log pi / d x_{v,p}[t, d]

which is the A G^T product of EAP (``cdscope.core.eap.edge_products``: one forward with
``EdgeHooks``, one backward to the 4L + 1 path aliases) with log pi in place of the
loss. With the family's shared gate and l_m the family mean (SPEC §2):

    dl_m / dg_e = (1 / n_m) sum_{b in m} d log pi_b / d g_e,   C[m, e] = dl_m/dg_e / l_m

Consistency with node gates: a_u enters every path that reads it, so the gradient of a
gate on u's whole write is the sum over u's outgoing edges,

    sum_{(v, p)} dl/dg_{(u, v, p)} = dl/dg_u      (``cdscope.core.control``, same batch)

Usage. F[m, e] is F of the edge's upstream node (the activation flowing along every
outgoing edge of u): the family mean of the mean over target-predicting positions of
||a_u[t]||_2 (SPEC §2); the ``emb`` node's a_u is h_0.

Gate set. Edge e is ``GateUnit(index=e, layer=<layer of v; L for the logits>,
sublayer="edge", unit=e)`` in an ``EdgeGateSet`` (granularity ``"edge"``,
``cdscope.core.gating.edge``) that also records each edge's ``(upstream, downstream, path)``;
the result is an ordinary ``ControlResult``, so the spectral measures (M x M Gram, never K x K) and the probe
frame work unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from cdscope.core.batch import ProbeBatch, mean_at_predicting_positions, row_chunks
from cdscope.core.control import ControlResult, frozen_parameters
from cdscope.core.eap import EdgeHooks, edge_products
from cdscope.core.gating.edge import edge_gate_set
from cdscope.core.likelihood import row_target_logprobs


def control_edges(
    model: nn.Module, batch: ProbeBatch, batch_size: int | None = None
) -> ControlResult:
    """C, F and l_m at edge granularity from one forward + one backward per micro-batch of
    at most ``batch_size`` rows (see the module docstring; parameters frozen meanwhile).

    Per-sample quantities are kept as in ``cdscope.core.control.control_autograd``:
    ``row_dlogp[b, e] = d log pi_b / d g_e`` (unweighted), ``row_F[b, e]``.
    """
    B = batch.B  # noqa: N806
    row_logp = torch.zeros(B, dtype=torch.float64)
    with EdgeHooks(model) as hooks, frozen_parameters(model):
        graph = hooks.graph
        gate_set = edge_gate_set(graph, hooks.arch)
        row_dlogp = torch.zeros(B, graph.E, dtype=torch.float64)
        row_F = torch.zeros(B, graph.E, dtype=torch.float64)
        for rows in row_chunks(B, batch_size, batch.lengths):
            logp = row_target_logprobs(model, batch, rows)
            row_dlogp[rows] = edge_products(hooks, batch, rows, logp).double().cpu()
            row_logp[rows] = logp.detach().double().cpu()
            device = hooks.activations[0].device
            norms = torch.stack(  # [b, U, T]: ||a_u[t]|| of every upstream node
                [
                    a.to(device, torch.promote_types(a.dtype, torch.float32)).norm(dim=-1)
                    for a in hooks.activations
                ],
                dim=1,
            )
            node_F = mean_at_predicting_positions(norms, batch, rows).double().cpu()
            row_F[rows] = node_F[:, graph.edge_up]
    return ControlResult.from_rows(batch, gate_set, "autograd", row_logp, row_dlogp, row_F)
