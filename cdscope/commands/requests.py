"""What the measuring workflows take, one dataclass each instead of an argument bundle:

* ``ProbeRun``: one probe measurement (``probe.collect_control``, also under a launcher);
* ``ProbeRequest``: where an audit's or nsweep's probe frame comes from (measured from
  paths, or an earlier file; ``audit_run.obtain_probe_frame``);
* ``EvalRequest``: one eval run (``evaluate.evaluate``).

The console, the output set and callbacks stay arguments: they are how a run reports and
writes, not what it measures.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdscope.core.models import LoadedModel
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import ProbePool
from cdscope.settings import EvalSettings, ProbeSettings


@dataclass(frozen=True)
class ProbeRun:
    """The models (specs for ``ModelOptions.load`` or loaded models: the Python API)
    measured with ``settings`` on ``pool`` by ``command``; written to ``out`` when given
    (with a progress file after each seed), ``resume``: False, True / 'keep' or
    'recompute' (``cdscope.output.resume``)."""

    models: Sequence[str | LoadedModel]
    pool: ProbePool
    settings: ProbeSettings
    out: Path | None = None
    options: ModelOptions = ModelOptions()
    resume: bool | str = False
    command: str = "probe"

    @property
    def names(self) -> list[str]:
        """The rows' model labels: each spec, or a loaded model's ``name``."""
        return [m.name if isinstance(m, LoadedModel) else m for m in self.models]


@dataclass(frozen=True)
class ProbeRequest:
    """Where the probe frame of an audit or an nsweep comes from: the ``model_specs``
    measured with ``settings`` on the pools at ``probe_paths`` into ``OUT.probe.parquet``
    (``resume``: False, True or 'recompute'), or the earlier probe file ``from_path``
    (``explicit``: the settings the user gave, checked against that file's)."""

    out: Path
    model_specs: list[str] | None
    settings: ProbeSettings
    from_path: Path | None = None
    probe_paths: list[Path] | None = None
    options: ModelOptions = ModelOptions()
    resume: bool | str = False
    explicit: dict[str, object] | None = None

    @property
    def source(self) -> str:
        """What the outputs' metadata records as the numbers' origin."""
        return str(self.from_path) if self.from_path else "measured"


@dataclass(frozen=True)
class EvalRequest:
    """One eval run: every model in ``model_specs`` on ``tasks`` with ``settings``, into
    ``out_dir`` (samples.parquet, passk.parquet), loaded with ``options``; ``resume`` as
    for the probe; ``hard_ids``: the --hard subset's task ids; ``task_sources``: task id ->
    the name of the file it came from (``contamination.benchmark_sources``), so that each
    ``--tasks`` file is a benchmark of its own unless its rows name one."""

    model_specs: Sequence[str]
    tasks: Sequence
    settings: EvalSettings
    out_dir: Path
    options: ModelOptions = ModelOptions()
    resume: bool | str = False
    hard_ids: Collection[str] | None = None
    task_sources: Mapping[str, str] | None = None
