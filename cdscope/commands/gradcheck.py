"""``cdscope gradcheck``: how close the first-order regulariser gradients are to the exact one.

For each probe seed: the exact gradient of R(C(theta)) (double backward, eager
attention) once, then the two fixed-step proxies (``proxy`` and ``folded``) at every eps
of the sweep (and, with ``richardson_sweep``, the Richardson proxy at every eps), and the
default estimator; each compared with the exact gradient by cosine and relative L2 error
(SPEC §5). One row per (model, seed, estimator, eps).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.commands.workflow import model_record
from cdscope.core.batch import encode_probe, rows_per_forward
from cdscope.core.gates import GatedModel
from cdscope.core.models.placement import require_resident_weights
from cdscope.core.probes import ProbePool, draw_probe, drawn_ids
from cdscope.core.regularizer import exact_grad, fidelity, regularizer_grad
from cdscope.distributed import single_process_only
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.finite import NonFinite
from cdscope.io import run_metadata, write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.frames import ModelOptions, describe_seeds
from cdscope.settings import (
    DEFAULT_EPS,
    DEFAULT_ESTIMATOR,
    GATE_GRANULARITIES,
    GradcheckSettings,
)

COLUMNS = [
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
    if settings.granularity not in GATE_GRANULARITIES:
        raise CdscopeError(
            f"gradcheck --granularity must be one of {', '.join(GATE_GRANULARITIES)}; "
            f"got {settings.granularity!r}"
        )
    console = console or make_console()
    seeds, n, template = settings.seeds, settings.n, settings.template
    eps_list, batch_size = settings.eps, settings.batch_size
    loaded = options.load(model_spec, console)
    require_resident_weights(loaded.model, "gradcheck")
    row_chunk = rows_per_forward(batch_size, loaded.device)
    variants = [(name, e) for name in ("proxy", "folded") for e in eps_list]
    if settings.richardson_sweep:
        variants += [("richardson", e) for e in eps_list]
    if (DEFAULT_ESTIMATOR, DEFAULT_EPS) not in variants:
        variants.append((DEFAULT_ESTIMATOR, DEFAULT_EPS))
    gated = GatedModel(loaded.model, granularity=settings.granularity)
    metadata = run_metadata(
        "gradcheck",
        probe_hash=pool.hash,
        probe_files=list(pool.paths),
        families=pool.families,
        seeds=describe_seeds(seeds),
        drawn={str(s): drawn_ids(draw_probe(pool, s, n)) for s in seeds},
        settings={
            "n": n,
            "template": template,
            "batch_size": row_chunk,
            "granularity": settings.granularity,
        },
        eps=list(eps_list),
        default={"estimator": DEFAULT_ESTIMATOR, "eps": DEFAULT_EPS},
        models=[model_record(loaded, gated.gate_set)],
    )
    rows: list[dict] = []
    with FileSet(out) as outputs, gated as gm, progress_bar(console) as progress:
        task = progress.add_task("gradcheck", total=len(seeds) * (1 + len(variants)))
        for seed in seeds:
            batch = encode_probe(
                draw_probe(pool, seed, n),
                loaded.tokenizer,
                template,
                pad_id=getattr(loaded.tokenizer, "pad_token_id", None) or 0,
            )
            batch.to(loaded.device)
            progress.update(task, description=f"seed {seed}: exact")
            try:
                exact = exact_grad(gm, batch, batch_size=row_chunk)
            except NonFinite as exc:
                raise exc.at(f"at seed {seed} of model {model_spec!r}") from None
            reference = exact.flat()  # flatten once per seed (~1 GB in float64 for 135M)
            exact.grads.clear()  # the flat copy is all the sweep needs
            progress.advance(task)
            for estimator, eps in variants:
                progress.update(task, description=f"seed {seed}: {estimator} eps={eps:g}")
                approx = regularizer_grad(gm, batch, estimator, eps, batch_size=row_chunk)
                rows.append(
                    {
                        "model": model_spec,
                        "seed": seed,
                        "estimator": estimator,
                        "eps": eps,
                        "is_default": (estimator, eps) == (DEFAULT_ESTIMATOR, DEFAULT_EPS),
                        **fidelity(approx, reference),
                        "seconds": approx.seconds,
                        "exact_seconds": exact.seconds,
                        "R": exact.R,
                    }
                )
                del approx
                progress.advance(task)
            del exact, reference  # the next seed's exact gradient needs the room
            write_parquet(pd.DataFrame(rows, columns=COLUMNS), partial_path(out), metadata)
        outputs.write_parquet(pd.DataFrame(rows, columns=COLUMNS), out, metadata)
        outputs.remove_on_commit(partial_path(out))
    return pd.DataFrame(rows, columns=COLUMNS)
