"""One CD-RFT optimizer step around any backend's backbone gradient (SPEC §5 steps 2-4).

Both training backends -- the hf loop (``train.loop``) and TRL's ``GRPOTrainer``
(``integrations.trl``, through a ``TrainerCallback``) -- drive one ``CDRFTStep`` per run,
calling the same methods in the same order once per optimizer step:

1. the backend's own GRPO backward (micro-batches accumulated into ``.grad``, backbone
   gradient clipping, if any, done);
2. ``before_update(t)`` -- B_shared / R of C on the probe at the current theta (the
   previous step's closing measurement, carried over: rollouts and backward passes do
   not move theta), then ``.grad += lambda * grad R(C(theta))`` (SPEC §5 step 2, the
   measurement handed to the estimator as its first pass), then the finite check: a
   non-finite gradient stops the run before the optimizer applies it;
3. the backend's optimizer step (SPEC §5 step 3: AdamW on grad L_post + lambda grad R);
4. ``after_update(t)`` -- B_shared after the update, the projection loop while
   B_shared > tau and fewer than K_max iterations (SPEC §5 step 4), the finite check on
   the parameters, and the closing measurement kept for step t + 1;
5. ``log_fields()`` -- the probe / regulariser / timing columns of the step's log row,
   with the MoE routing decisions the step's first-order estimates held
   (``routing_decisions`` / ``routing_switched`` / ``routing_unheld``, ``core.routing``;
   0 on a dense model).

With ``--regularizer none`` the same object measures (so both arms log B_shared) and
adds nothing. Under DDP (torchrun / accelerate launch) every rank holds the full
parameters, the same probe and, after the backward, the all-reduced mean backbone
gradient; each computes the same lambda grad R and rank 0's copy is broadcast (as are
rank 0's projected weights when rank 0 projected), so the regulariser enters once per
optimizer step, not once per rank, and kernels that are not bit-deterministic (CUDA
atomics) cannot let the replicas drift. Without a process group both are no-ops.

Under FSDP2 (the hf loop's ``--sharding fsdp``, TRL under accelerate's FSDP2 plugin) the
parameters are DTensor shards, each rank owning its own: nothing is broadcast. The
regulariser's gradient reaches the shards through FSDP's backward, every rank on the whole
probe (``core.grad_sink.GradSink``); the projection loop runs while rank 0's B_shared is
above tau and the finite checks agree over ranks (``engine.Shards``), so every rank takes
the same branches and FSDP's collectives match. In every engine a trainable parameter
that holds no gradient while others do stops the step with one line naming it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn
from torch.nn.utils import get_total_norm

from cdscope.core.batch import ProbeBatch, rows_per_forward
from cdscope.core.gating.model import GatedModel
from cdscope.core.grad_sink import require_reached
from cdscope.core.models.placement import execution_device
from cdscope.core.routing import RoutingCount
from cdscope.distributed import int_from_rank_zero, joined_world_size, tensors_from_rank_zero
from cdscope.errors import CdscopeError
from cdscope.settings.training import TrainConfig
from cdscope.train.cdrft import (
    ProbeMeasure,
    ProjectionResult,
    add_regularizer_grad,
    finite_params,
    measure_probe,
    project,
)
from cdscope.train.engine import shards_of, whole

Status = Callable[[str], None]


def _quiet(phase: str) -> None:
    """The default progress callback: says nothing."""


class CDRFTStep:
    """The CD-RFT part of every optimizer step of one run (see the module docstring).

    ``last_checkpoint``: the backend's newest complete checkpoint (or None), named in the
    message that stops a diverging run.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        gm: GatedModel,
        probe: ProbeBatch,
        params: Sequence[nn.Parameter],
        last_checkpoint: Callable[[], Path | None],
    ) -> None:
        self.cfg, self.gm, self.probe = cfg, gm, probe
        self.params = list(params)  # set again when an engine replaces them (TRL + FSDP2)
        self.last_checkpoint = last_checkpoint
        self.rows = rows_per_forward(cfg.probe_batch_size, execution_device(gm.model))
        #: the closing measurement of the last step: C at the theta the next step opens with
        self.carried: ProbeMeasure | None = None
        self.fields: dict[str, Any] = {}
        #: this step's MoE routing decisions held by the first-order estimates (regulariser
        #: + projection; ``core.routing``): none on a dense model or with --estimator exact
        self.routing = RoutingCount()

    @property
    def regularised(self) -> bool:
        return self.cfg.regularizer == "cdrft"

    def diverged(self, step: int, what: str) -> CdscopeError:
        """The one-line error that stops a run whose step ``step`` (1-based) went non-finite."""
        kept = self.last_checkpoint()
        where = f"the last good checkpoint is {kept}" if kept else "no checkpoint was written yet"
        return CdscopeError(
            f"training diverged at step {step}: {what} is not finite (NaN/inf); stopped before "
            f"applying it; {where}; lower --lr (or --lambda / --eta-proj) and rerun"
        )

    def before_update(self, step: int, status: Status = _quiet) -> ProbeMeasure:
        """After the backbone backward, before the optimizer step: measure at theta (or
        take the carried measurement), add lambda grad R to ``.grad``, check finiteness.
        Returns the measurement before the step."""
        cfg, shards = self.cfg, shards_of(self.params)
        began = time.perf_counter()
        before = self.carried
        if before is None:
            status("probe")
            before = measure_probe(self.gm, self.probe, self.rows)
        measure_s = time.perf_counter() - began
        reg_R, regularizer_s, reg_norm = math.nan, 0.0, 0.0  # noqa: N806
        routing = RoutingCount()
        if self.regularised and cfg.lam > 0:
            status("regulariser")
            began = time.perf_counter()
            result = add_regularizer_grad(
                self.gm, self.probe, self.params, cfg.lam, cfg.estimator, cfg.eps, self.rows,
                at=before,
            )  # fmt: skip
            reg_R, routing = result.R, result.routing or routing  # noqa: N806
            # ||lambda grad R|| (a DTensor norm is a collective: every rank takes it)
            reg_norm = cfg.lam * float(whole(get_total_norm(result.grads)))
            if not shards.sharded:  # DDP: the backbone part is already the all-reduced
                # mean, so rank 0's sum is everyone's (FSDP: each rank owns its shards)
                tensors_from_rank_zero([p.grad for p in self.params if p.grad is not None])
            regularizer_s = time.perf_counter() - began
        self._require_gradients()
        if not shards.all(finite_params(self.params)):
            raise self.diverged(step, "the gradient")
        self.fields = {
            "b_shared_before": before.b_shared,
            "r_before": before.R,
            "r_regularizer": reg_R,
            "grad_norm_reg": reg_norm,
            "measure_s": measure_s,
            "regularizer_s": regularizer_s,
        }
        self.routing = routing
        return before

    def after_update(self, step: int, status: Status = _quiet) -> ProjectionResult:
        """Right after the optimizer step: measure, project (cdrft), check the parameters,
        and carry the closing measurement over to the next step."""
        cfg, shards = self.cfg, shards_of(self.params)
        began = time.perf_counter()
        status("probe after the update")
        after = measure_probe(self.gm, self.probe, self.rows)
        self.fields["measure_s"] += time.perf_counter() - began
        if self.regularised:
            status("projection")
            proj = project(
                self.gm, self.probe, self.params, cfg.tau, cfg.k_max, cfg.eta_proj,
                cfg.estimator, cfg.eps, self.rows, start=after, agreed=shards.from_rank_zero,
                max_norm=cfg.proj_max_norm,
            )  # fmt: skip
        else:
            proj = ProjectionResult(0, after, after, 0.0)
        if not shards.sharded and joined_world_size() > 1 and int_from_rank_zero(proj.iterations):
            tensors_from_rank_zero([p.data for p in self.params])  # rank 0's projected weights
        if not shards.all(finite_params(self.params)):
            raise self.diverged(step, "a parameter after the update")
        self.carried = proj.after
        self.routing += proj.routing
        self.fields.update(
            b_shared_after_update=after.b_shared,
            b_shared_after=proj.after.b_shared,
            r_after=proj.after.R,
            proj_iters=proj.iterations,
            grad_norm_proj=proj.grad_norm_max,
            proj_moved=proj.moved,
            projection_s=proj.seconds,
            routing_decisions=self.routing.decisions,
            routing_switched=self.routing.switched,
            routing_unheld=self.routing.unheld,
        )
        return proj

    def _require_gradients(self) -> None:
        """No silent zero: once any trainable parameter holds a gradient for this step,
        every one must (an optimizer skips a parameter whose ``.grad`` is None, so a
        gradient that never reached it would leave it untrained without a word). A step
        with no completion token has no backbone gradient at all and is left alone."""
        reached = [p.grad is not None for p in self.params]
        if any(reached):
            require_reached(self.gm.model, self.params, reached, "the training step's gradient")

    def log_fields(
        self, timings: dict[str, float] | None = None, audit_b_shared: float = math.nan
    ) -> dict[str, Any]:
        """The step's probe and regulariser columns, then the backend's own phase
        ``timings`` (e.g. ``rollout_s``, ``backbone_s``), then the probe phases' seconds.
        ``audit_b_shared``: the audit probe's B_shared at the weights ``b_shared_before``
        was measured at (``train.evidence``; NaN when not measured)."""
        f = self.fields | {"audit_b_shared": audit_b_shared}
        return {
            **{k: f[k] for k in PROBE_COLUMNS},
            **(timings or {}),
            **{k: f[k] for k in TIMING_COLUMNS},
        }


#: the columns ``CDRFTStep.log_fields`` fills, in log order (docs/train.md)
PROBE_COLUMNS = (
    "b_shared_before", "audit_b_shared", "r_before", "b_shared_after_update", "b_shared_after",
    "r_after", "r_regularizer", "grad_norm_reg", "proj_iters", "grad_norm_proj", "proj_moved",
    "routing_decisions", "routing_switched", "routing_unheld",
)  # fmt: skip
TIMING_COLUMNS = ("measure_s", "regularizer_s", "projection_s")
