"""What both training backends share below their loops: the run's inputs and result, the
rewards, the per-step reward columns and the final-model folder.

* ``TrainInputs`` / ``TrainResult`` -- a prepared run (``commands.train.prepare``) and
  what a backend hands back;
* ``score`` -- the step's rewards (the caller's ``reward_fn`` or the shared verifiers,
  ``verifier_rewards``: passed -> 1.0, else 0.0; code only in the sandbox) and the
  ``reward`` / ``reward_<family>`` columns of the per-step log;
* ``save_final_model`` -- ``OUT/final`` as a Hugging Face folder, written atomically.

The hf loop (``train.loop``) and the TRL callback (``integrations.trl``) both import
from here; neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from cdscope.core.batch import ProbeBatch
from cdscope.settings.training import TrainConfig
from cdscope.tasks import Task, verify_many
from cdscope.train.evidence import EvidencePlan

#: the per-step log of a run, ``OUT/log.parquet`` (both backends)
LOG_NAME = "log.parquet"

RewardFn = Callable[[Sequence[Task], Sequence[str]], list[float]]


@dataclass
class TrainResult:
    out_dir: Path
    log: pd.DataFrame
    steps_done: int
    resumed_from: int | None
    final_dir: Path | None
    #: ``OUT/eval.parquet`` / ``OUT/audit.parquet`` rows (None: not measured; docs/train.md)
    eval: pd.DataFrame | None = None
    audit: pd.DataFrame | None = None
    eval_problems: pd.DataFrame | None = None  # ``OUT/eval_problems.parquet``


@dataclass
class TrainInputs:
    """Everything a run needs, prepared and validated by ``commands.train``."""

    cfg: TrainConfig
    model: nn.Module
    tokenizer: Any
    tasks: Sequence[Task]
    families: list[str]  # training families, sorted (reward columns)
    probe: ProbeBatch
    metadata: dict[str, Any]
    ref_model: nn.Module | None = None
    #: (tasks, completions) -> rewards; default: the shared verifiers (passed -> 1.0)
    reward_fn: RewardFn | None = None
    evidence: EvidencePlan = field(default_factory=EvidencePlan)

    def training_probe_record(self) -> dict[str, Any]:
        """What a trained model's folder records about its probes
        (``core.probes.TRAINING_PROBE_FILE``)."""
        keys = ("training_probe_items", "probe_split", "probe_hash", "audit_probe_items")
        return {k: self.metadata.get(k) for k in keys} | {"regularizer": self.cfg.regularizer}


def verifier_rewards(
    tasks: Sequence[Task], completions: Sequence[str], timeout: float = 5.0, workers: int = 2
) -> list[float]:
    """1.0 for every completion its task's verifier passes, else 0.0 (code: sandboxed)."""
    return _rewards(verify_many(tasks, completions, timeout=timeout, workers=workers))


def _rewards(verdicts: Sequence[Any]) -> list[float]:
    return [1.0 if v.passed else 0.0 for v in verdicts]


def score(
    inputs: TrainInputs, tasks: Sequence[Task], completions: Sequence[str]
) -> tuple[list[float], dict[str, float]]:
    """Each completion's reward (``inputs.reward_fn``, else the verifiers) and the step's
    reward columns: ``reward``, the mean over the completions, ``reward_<family>``, the
    mean over that family's completions (NaN when the step drew none), in float64, and
    ``verifier_errors``: completions whose judging raised (scored 0, ``Verdict.crashed``;
    a count that should stay 0 -- more says a verifier meets completions it cannot read)."""
    errors = 0
    if inputs.reward_fn is not None:
        scores = [float(s) for s in inputs.reward_fn(tasks, completions)]
    else:
        cfg = inputs.cfg
        verdicts = verify_many(
            tasks, completions, timeout=cfg.verify_timeout, workers=cfg.verify_workers
        )
        scores, errors = _rewards(verdicts), sum(bool(v.crashed) for v in verdicts)
    columns: dict[str, float] = {"reward": sum(scores) / len(scores), "verifier_errors": errors}
    for family in inputs.families:
        picked = [s for t, s in zip(tasks, scores, strict=True) if t.family == family]
        columns[f"reward_{family}"] = sum(picked) / len(picked) if picked else math.nan
    return scores, columns


def save_final_model(
    model: nn.Module, tokenizer: Any, target: Path, probe_record: dict[str, Any] | None = None
) -> Path | None:
    """``save_pretrained`` model + tokenizer into a temp folder, then rename to ``target``;
    ``probe_record`` (``TrainInputs.training_probe_record``) goes beside the weights, so an
    audit of the folder can tell the items it was trained on.

    Under a launcher every rank calls it and rank 0 alone writes (returns None elsewhere);
    an FSDP2-sharded model's full weights are gathered to rank 0 first (a collective)."""
    from cdscope.core.probes import write_training_probe
    from cdscope.distributed import is_sharded
    from cdscope.io import atomic_dir
    from cdscope.train.engine import full_model_state

    state = full_model_state(model) if is_sharded(model) else None
    if not _rank_zero():
        return None
    with atomic_dir(target) as tmp:  # writer errors: one line, the temp folder removed
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        if probe_record is not None:
            write_training_probe(Path(tmp), probe_record)
    return target


def _rank_zero() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
