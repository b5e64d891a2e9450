"""``cdscope report``: one self-contained HTML page of finished runs (docs/report.md).

Each RUN_OUTPUT is one run, found by what it is:

* an audit (bshared, acg, decompose): its per-seed Parquet ``OUT`` (or any file of its
  set: ``OUT.summary`` / ``.convergence`` / ``.probe.parquet``); the summary file beside it
  is required, the convergence file is read when present;
* an evaluation: its ``--out-dir`` (or the ``passk.parquet`` / ``samples.parquet`` in it);
* a training run: its ``--out-dir`` (or the ``log.parquet`` in it), with its held-out
  evidence (``eval.parquet``, ``audit.parquet``) when the run took it.

The kind comes from the ``command`` in the file's cdscope metadata, never from a name
alone. Every number on the page is read from these files (nothing is measured again);
figures are drawn by the same functions as ``--plot``. The verdict of ``--fail-above``
(mean B_shared(C) of each model against a threshold in percent) is the report's own
``--fail-above`` when given, else the one the audit ran with (recorded in its metadata).
The page is written atomically; any input that is not a cdscope run output is one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cdscope.commands.audit import AUDITS, UNITS, AuditResult, exceeding, sibling
from cdscope.errors import CdscopeError
from cdscope.io import atomic_write_bytes, check_writable, read_parquet

#: the audit set's sibling files: OUT.<suffix>.parquet
AUDIT_SIBLINGS = ("summary", "convergence", "probe")
EVAL_FILES = ("passk.parquet", "samples.parquet")
TRAIN_FILE = "log.parquet"
#: a training run's held-out evidence beside its log (train/evidence.py), read when present
EVIDENCE_FILES = ("eval.parquet", "audit.parquet")


@dataclass
class FailAboveVerdict:
    """``--fail-above``: the threshold (percent), where it came from, the models above it."""

    threshold: float
    source: str  # "report" (this command's option) or "run" (the audit's own)
    failed: list[str]
    label: str = "B_shared(C)"  # the gated measure (AuditSpec.gated_label)


@dataclass
class RunOutput:
    """One run of the report: its kind, the path it was named by, its tables and metadata."""

    kind: str  # audit | eval | train
    path: Path
    metadata: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    audit: AuditResult | None = None
    verdict: FailAboveVerdict | None = None


def _base_of(path: Path) -> Path:
    """``OUT.summary.parquet`` (or .convergence / .probe) -> ``OUT.parquet``."""
    for suffix in AUDIT_SIBLINGS:
        ending = f".{suffix}.parquet"
        if path.name.endswith(ending):
            return path.with_name(path.name.removesuffix(ending) + ".parquet")
    return path


#: a measure name of the packed form audits wrote before the tidy tables: PR[code], abs_cos[a|b]
_PACKED = re.compile(r"^(?P<measure>[^\[]+)\[(?P<family>[^|\]]+)(?:\|(?P<family_b>[^\]]+))?\]$")


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """An audit table as the tidy tables are (docs/api.md); one written before them
    (``PR[code]`` in ``measure``, no ``value_unit``) gets its columns from the names."""
    if "value_unit" in frame.columns or "measure" not in frame.columns:
        return frame
    parts = frame["measure"].str.extract(_PACKED)
    measure = parts["measure"].fillna(frame["measure"])
    columns = {
        "measure": measure,
        "family": parts["family"].astype(object).where(parts["family"].notna(), None),
        "family_b": parts["family_b"].astype(object).where(parts["family_b"].notna(), None),
        "value_unit": measure.map(lambda m: UNITS.get(m, "fraction")),
    }
    out = frame.drop(columns="measure")
    at = list(frame.columns).index("measure")
    for offset, (name, column) in enumerate(columns.items()):
        out.insert(at + offset, name, column)
    return out


def load_audit(path: Path) -> RunOutput:
    """An audit's per-seed file and its summary (mean and paired rows) as an AuditResult."""
    per_seed, metadata = read_parquet(path)
    # before issue 36 the per-seed bootstrap spread was stored as ci_low / ci_high
    per_seed = tidy(per_seed).rename(columns={"ci_low": "boot_low", "ci_high": "boot_high"})
    summary_path = sibling(path, "summary")
    if not summary_path.is_file():
        raise CdscopeError(
            f"{path} is an audit's per-seed file but its summary {summary_path} is missing; "
            f"recompute both with cdscope {metadata['command']} --from OUT.probe.parquet"
        )
    both = tidy(read_parquet(summary_path)[0])
    kind = both["kind"] if "kind" in both else pd.Series("mean", index=both.index)
    summary = both[kind == "mean"].drop(columns="kind", errors="ignore").dropna(axis=1, how="all")
    paired = both[kind == "paired"].drop(columns="kind", errors="ignore")
    convergence_path = sibling(path, "convergence")
    convergence = (
        read_parquet(convergence_path)[0] if convergence_path.is_file() else pd.DataFrame()
    )
    result = AuditResult(
        metadata["command"], per_seed, summary.reset_index(drop=True),
        paired.reset_index(drop=True), metadata, pd.DataFrame(), [], convergence,
        list(metadata.get("notes") or []),
    )  # fmt: skip
    return RunOutput("audit", path, metadata, audit=result)


def _load_dir(path: Path, kind: str) -> RunOutput:
    names = EVAL_FILES if kind == "eval" else (*EVIDENCE_FILES, TRAIN_FILE)
    tables, metadata = {}, {}
    for name in names:  # the log (train) is read last: its metadata is the run's
        if (path / name).is_file():
            tables[name.removesuffix(".parquet")], metadata = read_parquet(path / name)
    return RunOutput(kind, path, metadata, tables)


def find_output(path: Path) -> RunOutput:
    """What ``path`` holds (module doc), loaded; a one-line CdscopeError otherwise."""
    if path.is_dir():
        if (path / TRAIN_FILE).is_file():
            return _load_dir(path, "train")
        if (path / EVAL_FILES[0]).is_file():
            return _load_dir(path, "eval")
        raise CdscopeError(
            f"{path} holds no run cdscope report reads: a training run has {TRAIN_FILE}, an "
            f"evaluation {EVAL_FILES[0]}; for an audit give its Parquet file"
        )
    if not path.exists():
        raise CdscopeError(f"run output not found: {path}")
    _, metadata = read_parquet(path)  # one line for a file that is not cdscope's Parquet
    command = metadata.get("command")
    if command in AUDITS:
        return load_audit(_base_of(path))
    if command == "eval" and path.name in EVAL_FILES:
        return _load_dir(path.parent, "eval")
    if command == "train" and path.name == TRAIN_FILE:
        return _load_dir(path.parent, "train")
    raise CdscopeError(
        f"{path} was written by cdscope {command}; cdscope report reads the outputs of "
        f"{', '.join(AUDITS)}, eval and train"
    )


def verdict_of(run: RunOutput, fail_above: float | None) -> FailAboveVerdict | None:
    """``--fail-above`` on an audit: this command's threshold, else the run's own."""
    if run.audit is None:
        return None
    threshold, source = fail_above, "report"
    if threshold is None:
        threshold, source = run.metadata.get("fail_above"), "run"
    if threshold is None:
        return None
    spec = AUDITS[run.audit.command]
    failed = exceeding(run.audit.summary, float(threshold), spec.gated)
    return FailAboveVerdict(float(threshold), source, failed, spec.gated_label)


def section(run: RunOutput) -> str:
    """The run's part of the page, with its figure drawn as ``--plot`` draws it."""
    from cdscope.output import report_html

    if run.audit is not None:
        from cdscope.commands.audit_plot import audit_figure

        headline = AUDITS[run.audit.command].headline
        return report_html.audit_section(
            run.path, run.audit, headline, audit_figure(run.audit), run.verdict
        )
    if run.kind == "eval":
        from cdscope.output.plots import passk_figure

        passk = run.tables.get("passk")
        figure = passk_figure(passk) if passk is not None and len(passk) else None
        return report_html.eval_section(run.path, run.tables, run.metadata, figure)
    from cdscope.output.plots_train import evidence_figure, train_figure

    config = run.metadata.get("config") or {}
    log = run.tables["log"]
    regularizer = str(config.get("regularizer", "cdrft"))
    figure = train_figure(log, regularizer, config.get("tau")) if len(log) else None
    audit, evals = run.tables.get("audit"), run.tables.get("eval")
    evidence = (
        evidence_figure(log, audit, evals) if audit is not None or evals is not None else None
    )
    return report_html.train_section(run.path, run.tables, run.metadata, figure, evidence)


def build_report(paths: list[Path], out: Path, fail_above: float | None = None) -> list[RunOutput]:
    """Read every run in ``paths``, write the page to ``out``; the runs with their verdicts."""
    from cdscope.output.report_html import report_page

    if not paths:
        raise CdscopeError(
            "give at least one run output: an audit's Parquet, an eval or train folder"
        )
    if out.suffix.lower() not in (".html", ".htm"):
        raise CdscopeError(f"-o is the report page and must end in .html; got {out.name}")
    runs = []
    for path in paths:  # every input read before anything is created: a bad one leaves nothing
        run = find_output(Path(path))
        run.verdict = verdict_of(run, fail_above)
        runs.append(run)
    check_writable(out)
    page = report_page([(str(r.path), r.kind, section(r), r.verdict) for r in runs])
    atomic_write_bytes(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return runs
