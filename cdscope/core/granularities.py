"""Every ``--granularity`` by name (``cdscope.settings.names.GRANULARITIES``): the gates a probe
measures C through (SPEC §2), entered as a context for the measurements of one model.

* ``sublayer``, ``head``, ``expert``, ``neuron``: a ``GatedModel`` whose sites come from
  ``cdscope.core.gating.units.SITE_BUILDERS``; C by one backward (``autograd``) or by
  finite differences (``fd``), ``cdscope.core.control``.
* ``edge``: the edges of the EAP graph; C from EAP's one backward with log pi
  (``cdscope.core.edge_control``), which hooks the model per measurement.

The probe commands and ``gate_count`` go through ``gates_for``, so no caller branches on a
granularity name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from torch import nn

from cdscope.core.batch import ProbeBatch
from cdscope.core.control import ControlResult, control_autograd, control_finite_difference
from cdscope.core.eap_graph import edge_graph
from cdscope.core.edge_control import control_edges
from cdscope.core.gating.model import GatedModel
from cdscope.settings import ProbeSettings
from cdscope.settings.names import EDGE, GATE_GRANULARITIES, GRANULARITIES, require_one_of


class Gates(Protocol):
    """The gates of one model at one granularity: ``K`` of them; entered around the
    measurements; ``control`` measures C, F and l_m of a batch through them."""

    @property
    def K(self) -> int: ...  # noqa: N802 - the SPEC's symbol

    def __enter__(self) -> Gates: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def control(
        self, batch: ProbeBatch, settings: ProbeSettings, batch_size: int | None
    ) -> ControlResult: ...


class SiteGates:
    """A ``GatedModel`` granularity: its hooks installed while entered; C by
    ``settings.estimator``."""

    def __init__(self, model: nn.Module, granularity: str) -> None:
        self.gm = GatedModel(model, granularity=granularity)

    @property
    def K(self) -> int:  # noqa: N802 - the SPEC's symbol
        return self.gm.gate_set.K

    def __enter__(self) -> SiteGates:
        self.gm.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.gm.__exit__(*exc_info)

    def control(
        self, batch: ProbeBatch, settings: ProbeSettings, batch_size: int | None
    ) -> ControlResult:
        if settings.estimator == "autograd":
            return control_autograd(self.gm, batch, batch_size)
        return control_finite_difference(
            self.gm, batch, settings.fd_step, batch_size and 8 * batch_size, settings.fd_order
        )


class EdgeGates:
    """The edges of the EAP graph: nothing stays installed (``control_edges`` hooks the
    model for each measurement); C by EAP's backward (autograd only: ProbeSettings)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def K(self) -> int:  # noqa: N802 - the SPEC's symbol
        return edge_graph(self.model).E

    def __enter__(self) -> EdgeGates:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def control(
        self, batch: ProbeBatch, settings: ProbeSettings, batch_size: int | None
    ) -> ControlResult:
        return control_edges(self.model, batch, batch_size)


#: granularity name -> the builder of a model's gates at it
GATES: dict[str, Callable[[nn.Module], Gates]] = {
    **{name: partial(SiteGates, granularity=name) for name in GATE_GRANULARITIES},
    EDGE: EdgeGates,
}


def gates_for(model: nn.Module, granularity: str) -> Gates:
    """The gates of ``model`` at ``granularity`` (one line for an unknown name)."""
    require_one_of("--granularity", granularity, GRANULARITIES)
    return GATES[granularity](model)
