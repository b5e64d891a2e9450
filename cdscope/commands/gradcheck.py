"""``cdscope gradcheck``: how close the first-order regulariser gradients are to the exact one.

For each probe seed: the exact gradient of R(C(theta)) (double backward, eager
attention) once, then the two fixed-step proxies (``proxy`` and ``folded``) at every eps
of the sweep (and, with ``richardson_sweep``, the Richardson proxy at every eps), and the
default estimator; each compared with the exact gradient by cosine and relative L2 error
(SPEC §5). One row per (model, seed, estimator, eps); on an MoE model also the routing
decisions its perturbed forwards held (``routing_*``, ``cdscope.core.routing``; missing on
a dense model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import Progress

from cdscope.commands.workflow import model_record
from cdscope.core.batch import encode_probe, rows_per_forward
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import LoadedModel
from cdscope.core.models.opening import ModelOptions
from cdscope.core.models.placement import require_resident_weights
from cdscope.core.probes import ProbePool, draw_probe, drawn_ids
from cdscope.core.regularizer import exact_grad, fidelity, regularizer_grad
from cdscope.core.routing import RoutingCount
from cdscope.distributed import single_process_only
from cdscope.fileset import FileSet, partial_path
from cdscope.finite import NonFinite
from cdscope.io import run_metadata, write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.frames import describe_seeds
from cdscope.settings import (
    DEFAULT_EPS,
    DEFAULT_ESTIMATOR,
    GradcheckSettings,
)


def routing_columns(routing: RoutingCount | None) -> dict[str, int | None]:
    """``routing_decisions`` / ``routing_switched`` / ``routing_unheld`` of one gradient
    (None without MoE blocks)."""
    names = ("routing_decisions", "routing_switched", "routing_unheld")
    if routing is None:
        return dict.fromkeys(names)
    return dict(zip(names, (routing.decisions, routing.switched, routing.unheld), strict=True))


GRADCHECK_COLUMNS = [
    "model",
    "seed",
    "estimator",
    "eps",
    "is_default",
    "cosine",
    "rel_error",
    "seconds",
    "exact_seconds",
    "R",
    "routing_decisions",
    "routing_switched",
    "routing_unheld",
]


def run_gradcheck(
    *,
    model_spec: str,
    pool: ProbePool,
    settings: GradcheckSettings,
    out: Path,
    options: ModelOptions = ModelOptions(attn="eager"),
    console: Console | None = None,
) -> pd.DataFrame:
    """The sweep of the module docstring: the rows so far go to ``partial_path(out)`` after
    every seed, ``out`` is written when the sweep is complete (an earlier ``out`` stays
    as it was until then)."""
    single_process_only("gradcheck")
    console = console or make_console()
    loaded = options.load(model_spec, console)
    require_resident_weights(loaded.model, "gradcheck")
    row_chunk = rows_per_forward(settings.batch_size, loaded.device)
    variants = [(name, e) for name in ("proxy", "folded") for e in settings.eps]
    if settings.richardson_sweep:
        variants += [("richardson", e) for e in settings.eps]
    if (DEFAULT_ESTIMATOR, DEFAULT_EPS) not in variants:
        variants.append((DEFAULT_ESTIMATOR, DEFAULT_EPS))
    gated = GatedModel(loaded.model, granularity=settings.granularity)
    metadata = run_metadata(
        "gradcheck",
        probe_hash=pool.hash,
        probe_files=list(pool.paths),
        families=pool.families,
        seeds=describe_seeds(settings.seeds),
        drawn={str(s): drawn_ids(draw_probe(pool, s, settings.n)) for s in settings.seeds},
        settings={
            "n": settings.n,
            "template": settings.template,
            "batch_size": row_chunk,
            "granularity": settings.granularity,
        },
        eps=list(settings.eps),
        default={"estimator": DEFAULT_ESTIMATOR, "eps": DEFAULT_EPS},
        models=[model_record(loaded, gated.gate_set)],
    )
    sweep = _Sweep(model_spec, loaded, pool, settings, variants, row_chunk)
    rows: list[dict] = []
    with FileSet(out) as outputs, gated as gm, progress_bar(console) as progress:
        task = progress.add_task("gradcheck", total=len(settings.seeds) * (1 + len(variants)))
        for seed in settings.seeds:
            rows += sweep.seed(gm, seed, progress, task)
            write_parquet(
                pd.DataFrame(rows, columns=GRADCHECK_COLUMNS), partial_path(out), metadata
            )
        outputs.write_parquet(pd.DataFrame(rows, columns=GRADCHECK_COLUMNS), out, metadata)
        outputs.remove_on_commit(partial_path(out))
    return pd.DataFrame(rows, columns=GRADCHECK_COLUMNS)


@dataclass(frozen=True)
class _Sweep:
    """One model's sweep: per seed, the exact gradient and every (estimator, eps) variant
    against it."""

    model_spec: str
    loaded: LoadedModel
    pool: ProbePool
    settings: GradcheckSettings
    variants: list[tuple[str, float]]
    row_chunk: int | None

    def seed(self, gm: GatedModel, seed: int, progress: Progress, task: object) -> list[dict]:
        """The rows of ``seed``: one per variant (cosine and relative error vs exact)."""
        tokenizer = self.loaded.tokenizer
        batch = encode_probe(
            draw_probe(self.pool, seed, self.settings.n),
            tokenizer,
            self.settings.template,
            pad_id=getattr(tokenizer, "pad_token_id", None) or 0,
        )
        batch.to(self.loaded.device)
        progress.update(task, description=f"seed {seed}: exact")
        try:
            exact = exact_grad(gm, batch, batch_size=self.row_chunk)
        except NonFinite as exc:
            raise exc.at(f"at seed {seed} of model {self.model_spec!r}") from None
        reference = exact.flat()  # flatten once per seed (~1 GB in float64 for 135M)
        exact.grads.clear()  # the flat copy is all the sweep needs
        progress.advance(task)
        rows = []
        for estimator, eps in self.variants:
            progress.update(task, description=f"seed {seed}: {estimator} eps={eps:g}")
            approx = regularizer_grad(gm, batch, estimator, eps, batch_size=self.row_chunk)
            rows.append(
                {
                    "model": self.model_spec,
                    "seed": seed,
                    "estimator": estimator,
                    "eps": eps,
                    "is_default": (estimator, eps) == (DEFAULT_ESTIMATOR, DEFAULT_EPS),
                    **fidelity(approx, reference),
                    "seconds": approx.seconds,
                    "exact_seconds": exact.seconds,
                    "R": exact.R,
                    **routing_columns(approx.routing),
                }
            )
            del approx
            progress.advance(task)
        return rows  # exact and reference go with this frame: the next seed needs the room
