"""Experiment tracking of a training run: ``--report-to tensorboard | trackio | wandb``.

Both backends send the tracker the fields of ``OUT/log.parquet``, one point per
optimizer step, named as Hugging Face's Trainer names training metrics (``train/<column>``,
``rewrite_logs`` in transformers' integrations), so a run looks the same from either
backend and next to other TRL runs:

* hf loop: ``tracking`` opens the tracker for the run and ``log`` sends each step's row
  (``train.loop`` calls it right after the row is written to log.parquet).
  TensorBoard writes event files to ``OUT/tensorboard`` (flushed every step, so a killed
  run keeps what it logged; a ``--resume`` purges the events of steps after the
  checkpoint, which are taken again); trackio and W&B log to their usual places
  (``TRACKIO_PROJECT`` / ``WANDB_PROJECT``, default project ``cdscope``; ``WANDB_MODE=offline``
  works as usual) with the run's settings as the config.
* TRL: ``report_to`` goes to GRPOConfig as TRL's own option, so TRL's tracker callbacks
  log TRL's metrics as they always do; ``cdscope_fields`` adds the log row's fields to
  the same log call (``integrations.trl``), so they land in the same run of the same
  tracker (TensorBoard: TRL's default ``OUT/trl/runs/<time>_<host>``, or
  ``TENSORBOARD_LOGGING_DIR``).

Only finite numbers are sent: a NaN cell of the log (``reward_code`` on a step that drew
no code task) is no point on a chart. A tracker package that is not installed is one line
naming the pip command (``require_tracker``), before the model loads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import numbers
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cdscope.errors import CdscopeError, missing_extra
from cdscope.train.config import REPORT_TO, TrainConfig

#: the prefix Hugging Face's Trainer integrations give training metrics
PREFIX = "train/"
#: the package each tracker imports (and the pyproject extra of the same name)
PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
#: TensorBoard's event files of an hf-loop run, under OUT
TENSORBOARD_DIR = "tensorboard"


def require_tracker(name: str) -> None:
    """One line for an unknown tracker or one whose package is not installed."""
    if name not in REPORT_TO:
        raise CdscopeError(f"--report-to must be one of {' | '.join(REPORT_TO)}; got {name!r}")
    if name != "none" and importlib.util.find_spec(PACKAGES[name]) is None:
        raise missing_extra(f"--report-to {name}", name, f"no module named {PACKAGES[name]!r}")


def cdscope_fields(row: dict[str, Any]) -> dict[str, float]:
    """The log row's finite numeric fields, ``step`` aside (it is the x axis)."""
    out = {}
    for name, value in row.items():
        if name == "step" or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if math.isfinite(float(value)):
            out[name] = float(value)
    return out


class _TensorBoard:
    def __init__(self, cfg: TrainConfig, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # steps after the checkpoint a --resume starts from are logged again: drop the old ones
        purge = first_step + 1 if first_step > 0 else None
        self.writer = SummaryWriter(str(Path(cfg.out_dir) / TENSORBOARD_DIR), purge_step=purge)
        if first_step == 0:
            self.writer.add_text("config", json.dumps(cfg.to_dict(), default=str))

    def log(self, fields: dict[str, float], step: int) -> None:
        for name, value in fields.items():
            self.writer.add_scalar(PREFIX + name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Module:
    """trackio and wandb: the same three calls (init with project, name and config; log
    with step; finish)."""

    def __init__(self, name: str, cfg: TrainConfig) -> None:
        self.module = importlib.import_module(PACKAGES[name])
        project = os.environ.get(f"{name.upper()}_PROJECT", "cdscope")
        self.module.init(project=project, name=Path(cfg.out_dir).name, config=cfg.to_dict())

    def log(self, fields: dict[str, float], step: int) -> None:
        self.module.log({PREFIX + k: v for k, v in fields.items()}, step=step)

    def close(self) -> None:
        self.module.finish()


@contextlib.contextmanager
def tracking(cfg: TrainConfig, first_step: int = 0) -> Iterator[Callable[[dict], None]]:
    """The hf loop's tracker for ``cfg.report_to``: yields ``log(row)``; closed at the end
    of the block (also when a step fails). ``first_step``: the steps already done."""
    if cfg.report_to == "none":
        yield lambda row: None
        return
    require_tracker(cfg.report_to)
    tracker = (
        _TensorBoard(cfg, first_step)
        if cfg.report_to == "tensorboard"
        else _Module(cfg.report_to, cfg)
    )
    try:
        yield lambda row: tracker.log(cdscope_fields(row), int(row["step"]))
    finally:
        tracker.close()
