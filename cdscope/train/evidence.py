"""Held-out evidence while a run trains: pass@k on held-out tasks and B_shared on an audit
probe the regulariser never sees (docs/train.md "Evidence while training").

The training probe is what CD-RFT optimises, so its B_shared falling says only that the
regulariser fitted those items. Two measurements tell a changed *model* apart:

* ``--eval-every N``: pass@k per family on held-out tasks (``--eval-tasks``; default the
  held-out split of the training files, ``heldout_paths``), with ``cdscope eval``'s
  estimator, seeds, engine and verifiers (``tasks.evaluation`` through
  ``core.engines.HFEngine`` on the model in memory), into ``OUT/eval.parquet``;
* ``--audit-every N``: B_shared, B_dir, B_norm and R of C on ``--audit-seeds`` draws of
  ``--audit-n`` items per family from the audit probe (default: the audit half of the
  training pool, ``core.probes.split_pool``; it shares no item with the training probe),
  into ``OUT/audit.parquet``; the seeds' mean becomes the log's ``audit_b_shared``.

Each is taken at the state after 0 steps, every N steps and after the last step (``due``),
on every rank (a sharded model needs them all), written by rank 0. Neither touches the
parameters, their gradients or the global RNG (generation forks it), so a run trains the
same weights with or without evidence (tested). A ``--resume`` keeps the rows of the
states its checkpoint reached and measures the rest again.

``plan_evidence`` checks the inputs before the model loads: held-out tasks that overlap the
training tasks (``tasks.contamination.audit``: one warning line, counts in the metadata),
families never trained on (allowed, listed in the metadata), and an audit probe that
shares items with the training probe (one warning line, ``audit_disjoint`` false) or holds
nothing else (refused).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from cdscope.analysis.passk import summarize
from cdscope.analysis.spectral import b_dir, b_norm
from cdscope.analysis.uncertainty import corrected_measures
from cdscope.core.batch import ProbeBatch, encode_probe
from cdscope.core.engines.hf import HFEngine
from cdscope.core.gating.model import GatedModel
from cdscope.core.probes import ProbePool, draw_probe, item_overlap, load_pool, split_pool
from cdscope.errors import CdscopeError
from cdscope.io import content_hash, rows_up_to, write_parquet
from cdscope.messages import warn
from cdscope.settings import EvalSettings
from cdscope.settings.training import TrainConfig
from cdscope.tasks import Task, default_task_paths, load_tasks
from cdscope.tasks.evaluation import sample_problems, select
from cdscope.tasks.io import audit, items_from_tasks, split_source
from cdscope.tasks.sandbox import require_sandbox_for
from cdscope.train.cdrft import measure_probe
from cdscope.train.engine import gathered

EVAL_NAME = "eval.parquet"
#: per held-out problem and state: its samples and how many passed (paired comparisons of
#: two states over the same problems, e.g. a t-interval of the per-problem pass@1 change)
EVAL_PROBLEMS_NAME = "eval_problems.parquet"
AUDIT_NAME = "audit.parquet"
#: contamination counts that flag a held-out item as seen in training
FLAGS = ("exact", "normalised", "jaccard>=0.8", "same_asserts")


def heldout_paths(train_specs: Sequence[str]) -> list[str]:
    """The held-out split of the training task files: for ``.../train/NAME`` its sibling
    ``.../eval/NAME`` when every training file has one (the shipped sets and the
    curriculum are laid out so); otherwise the shipped ``eval`` sets."""
    if not train_specs:
        return [str(p) for p in default_task_paths("eval")]
    siblings = []
    for spec in train_specs:
        path = Path(split_source(spec)[0])  # a PATH?MAPPING source: its path
        sibling = path.parent.parent / "eval" / path.name
        if path.parent.name != "train" or not sibling.is_file():
            return [str(p) for p in default_task_paths("eval")]
        siblings.append(str(sibling))
    return siblings


def due(step: int, every: int | None, steps: int) -> bool:
    """Evidence at the state after ``step`` optimizer steps: 0, every ``every``, the last."""
    return every is not None and (step % every == 0 or step == steps)


@dataclass
class EvidencePlan:
    """What a run measures besides its training probe; built before the model loads."""

    eval_chosen: list[tuple[Task, str]] = field(default_factory=list)  # (task, benchmark)
    eval_settings: EvalSettings | None = None
    audit_pool: ProbePool | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def plan_evidence(
    cfg: TrainConfig,
    tasks: Sequence[Task],
    families: Sequence[str],
    pool: ProbePool,
    training_items: Sequence[str],
    console: Console,
) -> EvidencePlan:
    """Check and prepare ``--eval-*`` / ``--audit-*`` (see the module docstring). ``pool``
    is the whole training pool (its audit half is the default audit probe)."""
    plan = EvidencePlan()
    plan.metadata["training_probe_items"] = list(training_items)
    if cfg.eval_every is not None:
        _plan_eval(cfg, tasks, families, plan, console)
    if cfg.audit_every is not None:
        _plan_audit(cfg, pool, training_items, plan, console)
    return plan


def _plan_eval(
    cfg: TrainConfig,
    tasks: Sequence[Task],
    families: Sequence[str],
    plan: EvidencePlan,
    console: Console,
) -> None:
    paths = list(cfg.eval_tasks) or heldout_paths(cfg.tasks)
    heldout = load_tasks(paths)
    plan.eval_chosen = select(heldout, cfg.eval_limit)
    chosen = [t for t, _ in plan.eval_chosen]
    require_sandbox_for(chosen, "drop the code task files from --eval-tasks")
    plan.eval_settings = EvalSettings(
        n=cfg.eval_n, ks=tuple(cfg.eval_k), seed=cfg.seed,
        max_new_tokens={"*": cfg.eval_max_new_tokens or cfg.max_new_tokens},
        limit=cfg.eval_limit, timeout=cfg.verify_timeout, workers=cfg.verify_workers,
    )  # fmt: skip
    found = audit(items_from_tasks(chosen), {"train": items_from_tasks(tasks)})
    flagged = {flag: int(found[flag].sum()) for flag in FLAGS if flag in found}
    if any(flagged.values()):
        counts = ", ".join(f"{k} {v}" for k, v in flagged.items() if v)
        warn(
            console,
            f"held-out tasks overlap the training tasks (contamination audit: {counts} of "
            f"{len(chosen)} items): their pass@k is not held-out evidence; pass other --eval-tasks",
        )
    untrained = sorted({t.family for t in chosen} - set(families))
    plan.metadata.update(
        eval_task_files=paths,
        eval_tasks_hash=content_hash([t.to_record() for t in chosen]),
        eval_settings=plan.eval_settings.comparable() | {"ks": list(cfg.eval_k)},
        eval_contamination=flagged,
        eval_untrained_families=untrained,  # allowed: pass@k of families not trained on
    )


def _plan_audit(
    cfg: TrainConfig,
    pool: ProbePool,
    training_items: Sequence[str],
    plan: EvidencePlan,
    console: Console,
) -> None:
    # a user's --audit-probe files are the audit probe; by default the pool's audit half
    audit_pool = load_pool(list(cfg.audit_probe)) if cfg.audit_probe else split_pool(pool, "audit")
    if len(audit_pool.families) < 2:
        raise CdscopeError(
            f"--audit-probe needs at least 2 task families (M >= 2); it has "
            f"{len(audit_pool.families)}: {', '.join(audit_pool.families)}"
        )
    drawn = sorted(
        {i.id for s in range(cfg.audit_seeds) for i in draw_probe(audit_pool, s, cfg.audit_n)}
    )
    shared = item_overlap(drawn, training_items)
    if len(shared) == len(drawn):
        raise CdscopeError(
            "the audit probe holds only items of the training probe: it would measure the "
            "regulariser's fit, not the model; pass another --audit-probe (or none: the audit "
            "half of the pool)"
        )
    if shared:
        warn(
            console,
            f"the audit probe shares {len(shared)} of its {len(drawn)} items with the training "
            f"probe ({', '.join(shared[:3])}{', ...' if len(shared) > 3 else ''}): "
            "audit_disjoint is false; B_shared there is partly the regulariser's fit",
        )
    plan.audit_pool = audit_pool
    plan.metadata.update(
        audit_probe_items=drawn,
        audit_disjoint=not shared,
        audit_probe_hash=audit_pool.hash,
        audit_probe_split=audit_pool.split,
        audit_probe_files=list(audit_pool.paths),
    )


class Evidence:
    """The run's evidence rows, measured when ``due`` and written to ``OUT``.

    ``measure(step)`` takes what is due at the state after ``step`` optimizer steps (and
    not already kept from an earlier invocation); ``audit_b_shared(step)`` is the audit
    seeds' mean B_shared at that state (NaN when none was taken), for the log row whose
    ``b_shared_before`` was measured at the same weights."""

    def __init__(
        self,
        cfg: TrainConfig,
        plan: EvidencePlan,
        gm: GatedModel,
        tokenizer: Any,
        metadata: dict[str, Any],
        rows_per_forward: int | None,
        kept_until: int | None = None,
        write: bool = True,
    ) -> None:
        self.cfg, self.plan, self.gm, self.tokenizer = cfg, plan, gm, tokenizer
        self.metadata, self.rows, self.write = metadata, rows_per_forward, write
        self.out = Path(cfg.out_dir)
        self.eval_rows = rows_up_to(self.out / EVAL_NAME, kept_until)
        self.eval_problem_rows = rows_up_to(self.out / EVAL_PROBLEMS_NAME, kept_until)
        self.audit_rows = rows_up_to(self.out / AUDIT_NAME, kept_until)
        if kept_until is not None:  # a resume: the files lose the states it takes again
            for name, rows in (
                (EVAL_NAME, self.eval_rows),
                (EVAL_PROBLEMS_NAME, self.eval_problem_rows),
                (AUDIT_NAME, self.audit_rows),
            ):
                if (self.out / name).is_file():
                    self._write(name, rows)
        self.batches: list[ProbeBatch] = []
        if plan.audit_pool is not None:
            pad_id = getattr(tokenizer, "pad_token_id", None) or 0
            device = next(gm.model.parameters()).device
            for seed in range(cfg.audit_seeds):
                items = draw_probe(plan.audit_pool, seed, cfg.audit_n)
                batch = encode_probe(items, tokenizer, cfg.template, pad_id=pad_id)
                self.batches.append(batch.to(device))

    def measure(
        self, step: int, status: Callable[[str], None] = lambda phase: None
    ) -> dict[str, float]:
        """Whatever is due at state ``step``; returns the tracker fields measured now.
        ``status`` names each measurement as it starts (a line per phase in a log)."""
        fields: dict[str, float] = {}
        cfg = self.cfg
        if due(step, cfg.eval_every, cfg.steps) and not self._has(self.eval_rows, step):
            status("held-out pass@k")
            frame, problems = self._eval(step)
            self.eval_rows = pd.concat([self.eval_rows, frame], ignore_index=True)
            self.eval_problem_rows = pd.concat(
                [self.eval_problem_rows, problems], ignore_index=True
            )
            self._write(EVAL_NAME, self.eval_rows)
            self._write(EVAL_PROBLEMS_NAME, self.eval_problem_rows)
            for row in frame[frame["level"] != "benchmark"].itertuples():
                fields[f"eval/pass@{row.k}/{row.family}"] = float(row.pass_at_k)
        if due(step, cfg.audit_every, cfg.steps) and not self._has(self.audit_rows, step):
            status("audit probe")
            frame = self._audit(step)
            self.audit_rows = pd.concat([self.audit_rows, frame], ignore_index=True)
            self._write(AUDIT_NAME, self.audit_rows)
            for name in ("b_shared", "b_dir", "b_norm"):
                fields[f"audit/{name}"] = float(frame[name].mean())
        return fields

    @staticmethod
    def _has(rows: pd.DataFrame, step: int) -> bool:
        return not rows.empty and bool((rows["step"] == step).any())

    def audit_b_shared(self, step: int) -> float:
        """Mean B_shared over the audit seeds at state ``step`` (NaN when not measured)."""
        if self.audit_rows.empty:
            return math.nan
        at = self.audit_rows[self.audit_rows["step"] == step]
        return float(at["b_shared"].mean()) if not at.empty else math.nan

    def _eval(self, step: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """pass@k per benchmark, family and overall of the model as it is now, and per
        problem its sample count and passes (``EVAL_PROBLEMS_NAME``)."""
        began = time.perf_counter()
        settings = self.plan.eval_settings
        assert settings is not None
        model = self.gm.model
        engine = HFEngine(
            model, self.tokenizer, settings.temperature, settings.top_p, settings.batch_size
        )
        with gathered(model):  # sharded: all-gathered once for the whole generation
            samples = sample_problems("policy", engine, self.plan.eval_chosen, settings)[0]
        table = summarize(samples, settings.ks)
        trained = set(self.metadata.get("training_families", []))
        per_problem = (
            samples.groupby(["benchmark", "domain", "problem_id"], sort=False)["passed"]
            .agg(samples="size", correct="sum")
            .reset_index()
            .rename(columns={"domain": "family"})
        )
        per_problem.insert(0, "step", step)
        return pd.DataFrame(
            {
                "step": step,
                "level": table["level"].replace({"domain": "family"}),
                "family": table["domain"].replace({"": "all"}),
                "benchmark": table["benchmark"],
                "k": table["k"],
                "pass_at_k": table["pass_at_k"],
                "problems": table["problems"],
                # a family the policy trains on (None for the overall mean)
                "trained": table["domain"]
                .isin(trained)
                .astype(object)
                .where(table["domain"] != ""),
                "samples": settings.n,
                "seconds": time.perf_counter() - began,
            }
        ), per_problem

    def _audit(self, step: int) -> pd.DataFrame:
        """B_shared, B_dir, B_norm and R of C on every audit seed, at the current weights."""
        rows = []
        for seed, batch in enumerate(self.batches):
            began = time.perf_counter()
            measured = measure_probe(self.gm, batch, self.rows)
            C = measured.control.C_kept()  # noqa: N806
            # the noise-corrected twin (needs n >= 2) and the eigenvalue mass clipped to read
            # it: a separate quantity, never compared with the plain one (docs/bshared.md)
            corrected = corrected_measures(measured.control.kept_samples(), ["B_shared_C_unbiased"])
            rows.append(
                {
                    "step": step,
                    "seed": seed,
                    "b_shared": measured.b_shared,
                    "b_dir": float(b_dir(C)),
                    "b_norm": float(b_norm(C)),
                    "R": measured.R,
                    "b_shared_unbiased": corrected.get("B_shared_C_unbiased", math.nan),
                    "gram_negative_mass": corrected.get("gram_negative_mass", math.nan),
                    "n": self.cfg.audit_n,
                    "families": ",".join(measured.families),
                    "seconds": time.perf_counter() - began,
                }
            )
        return pd.DataFrame(rows)

    def _write(self, name: str, frame: pd.DataFrame) -> None:
        if self.write:
            write_parquet(frame, self.out / name, self.metadata)

    def frames(self) -> dict[str, pd.DataFrame | None]:
        """The rows so far (None for evidence this run does not take)."""
        return {
            "eval": self.eval_rows if self.cfg.eval_every is not None else None,
            "eval_problems": self.eval_problem_rows if self.cfg.eval_every is not None else None,
            "audit": self.audit_rows if self.cfg.audit_every is not None else None,
        }
