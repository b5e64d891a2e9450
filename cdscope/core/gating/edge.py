"""The edge gate set (SPEC §2, §6): one gate per edge ``(upstream -> downstream, path)`` of
the EAP graph (``cdscope.core.eap_graph``). Edge gates are not hooks of a ``GatedModel``: C at
edge granularity comes from EAP's one backward (``cdscope.core.edge_control``), whose result
carries this gate set.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdscope.core.eap_graph import EdgeGraph
from cdscope.core.gates.vocabulary import GateSet, GateUnit
from cdscope.core.models.architecture import Architecture
from cdscope.settings.names import EDGE

#: the long frame's extra columns at edge granularity (``EdgeGateSet`` per edge)
EDGE_COLUMNS = ("upstream", "downstream", "path")


@dataclass(frozen=True)
class EdgeGateSet(GateSet):
    """A gate set whose units are edges; ``edges[e]`` is ``(upstream, downstream, path)``."""

    edges: tuple[tuple[str, str, str], ...] = ()

    @property
    def upstream(self) -> list[str]:
        return [u for u, _, _ in self.edges]

    @property
    def downstream(self) -> list[str]:
        return [v for _, v, _ in self.edges]

    @property
    def paths(self) -> list[str]:
        return [p for _, _, p in self.edges]

    @property
    def frame_columns(self) -> dict[str, list]:
        """Each edge's upstream and downstream node and path (``EDGE_COLUMNS``)."""
        return dict(zip(EDGE_COLUMNS, (self.upstream, self.downstream, self.paths), strict=True))


def edge_gate_set(graph: EdgeGraph, arch: Architecture) -> EdgeGateSet:
    """One gate per edge of ``graph``, in edge order; ``layer`` is the downstream node's."""
    layer_of = {node: w.layer for node, w in zip(graph.upstream[1:], arch.writes, strict=True)}
    layer_of["logits"] = arch.num_layers
    edges = tuple(graph.edges())
    units = tuple(GateUnit(e, layer_of[v], EDGE, e) for e, (_, v, _) in enumerate(edges))
    return EdgeGateSet(units, EDGE, edges)
