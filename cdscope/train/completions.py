"""``--log-completions``: every rollout of every step in ``OUT/completions.parquet``.

One row per completion: the step (1-based, as in the log), the task it answers and its
family, its sample index within the prompt's group, the decoded text, its token count,
whether it was truncated (reached ``--max-new-tokens`` without an EOS), its reward and
its advantage (``train.grpo.group_advantages``) -- what a user reads to see *what* the
policy learned to write, the way TRL's ``log_completions`` shows its trackers. Written by
rank 0 after each step (atomic, like the log); a ``--resume`` keeps the rows of the steps
its checkpoint reached and writes the rest again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from cdscope.core.generation import Rollouts
from cdscope.io import rows_up_to, write_parquet

COMPLETIONS_NAME = "completions.parquet"


class CompletionLog:
    """The growing table of a run's rollouts (module doc)."""

    def __init__(
        self, out_dir: Path, metadata: dict[str, Any], kept_until: int | None, write: bool
    ) -> None:
        self.path = Path(out_dir) / COMPLETIONS_NAME
        self.metadata, self.write = metadata, write
        self.rows = rows_up_to(self.path, kept_until)

    def add(
        self,
        step: int,
        tasks: list[Any],
        rollouts: Rollouts,
        rewards: list[float],
        advantages: torch.Tensor,
    ) -> None:
        """Append step ``step``'s rollouts (row i answers ``tasks[i]``) and rewrite the file."""
        group = int(torch.bincount(rollouts.prompt_index).max()) if len(tasks) else 1
        frame = pd.DataFrame(
            {
                "step": step,
                "problem_id": [t.id for t in tasks],
                "family": [t.family for t in tasks],
                "sample": [i % group for i in range(len(tasks))],
                "completion": rollouts.texts,
                "generated_tokens": rollouts.completion_mask.sum(dim=1).tolist(),
                "truncated": rollouts.truncated.tolist(),
                "reward": [float(r) for r in rewards],
                "advantage": advantages.double().tolist(),
            }
        )
        self.rows = pd.concat([self.rows, frame], ignore_index=True)
        if self.write:
            write_parquet(self.rows, self.path, self.metadata)
