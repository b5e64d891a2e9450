"""The ``cdscope report`` page: one section per run, in the order given (docs/report.md).

A section holds, top to bottom: the run's kind and path, the ``--fail-above`` verdict (an
audit with a threshold), the headline numbers, the figure (inline PNG), the terminal's
tables (``render.py``, ``render_runs.py`` through ``html.rich_table``: the same cells a
terminal shows) and the run's metadata (command line, versions, models with revisions,
probe, settings). Values are shown as the terminal shows them: fractions in percent, PR in
gates (SPEC §3). The page starts with a table of contents and the overall verdict.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cdscope.output import html
from cdscope.output.notebook import (
    HEADLINE_HEADERS,
    headline_measures,
    headline_note,
    headline_rows,
)
from cdscope.output.render import audit_table, convergence_table, per_seed_table, short_model_name
from cdscope.output.render_runs import evidence_table, passk_table, train_table
from cdscope.version import __version__

#: run metadata shown first, in this order (the rest follows under "all metadata")
META_KEYS = (
    "command_line", "created_utc", "cdscope_version", "torch_version", "transformers_version",
    "python_version", "source", "reference_model", "bootstrap", "detect", "fail_above",
)  # fmt: skip
MODEL_KEYS = ("name", "source", "revision", "architecture", "K", "granularity", "dtype", "device")


def _anchor(index: int) -> str:
    return f"run-{index + 1}"


def _verdict(verdict: Any) -> str:
    """The ``--fail-above`` box: PASS or FAIL with the models above the threshold."""
    if verdict is None:
        return ""
    where = "this report's --fail-above" if verdict.source == "report" else "the run's --fail-above"
    if verdict.failed:
        body = (f"FAIL: mean {verdict.label} above {verdict.threshold:g}% ({where}): "
                f"{', '.join(verdict.failed)}")  # fmt: skip
        return html.element("div", html.text(body), class_="verdict fail")
    body = (f"PASS: every model's mean {verdict.label} is at most {verdict.threshold:g}% "
            f"({where})")  # fmt: skip
    return html.element("div", html.text(body), class_="verdict pass")


def _models(records: Sequence[dict]) -> str:
    if not records:
        return ""
    rows = [
        [str(r.get(k, "")) if r.get(k) is not None else "" for k in MODEL_KEYS] for r in records
    ]
    return html.element("h3", "models") + html.table(MODEL_KEYS, rows)


def _metadata(metadata: dict) -> str:
    """The run's metadata: the main keys as a list, models as a table, all of it as JSON."""
    probe = metadata.get("probe") if isinstance(metadata.get("probe"), dict) else {}
    items = [(k, metadata[k]) for k in META_KEYS if metadata.get(k) not in (None, "", [])]
    settings = probe.get("settings") or metadata.get("settings") or {}
    for key in ("probe_hash", "families", "probe_families", "training_families", "seeds",
                "probe_files", "probe_items"):  # fmt: skip
        value = probe.get(key, metadata.get(key))
        if value not in (None, "", []):
            items.append((key, value if isinstance(value, str) else json.dumps(value)))
    if settings:
        items.append(("settings", json.dumps(settings, default=str)))
    models = probe.get("models") or metadata.get("models") or []
    if isinstance(metadata.get("model"), dict):
        models = [metadata["model"]]
    full = html.element("pre", html.text(json.dumps(metadata, indent=1, default=str)))
    return (
        html.element("h3", "run metadata")
        + html.definitions(items)
        + _models(models)
        + html.element("details", html.element("summary", "all metadata (JSON)") + full)
    )


def _header(path: Path, kind: str) -> str:
    return html.element("h2", html.text(f"{kind}: {path}"))


def audit_section(path: Path, result: Any, headline: str, figure: Any, verdict: Any) -> str:
    """An audit (bshared, acg, decompose): verdict, headline, figure, tables, metadata."""
    summary, paired = result.summary, result.paired
    measures = headline_measures(summary, headline)
    headers = list(HEADLINE_HEADERS) if len(paired) else list(HEADLINE_HEADERS[:4])
    rows = [r[: len(headers)] for r in headline_rows(summary, paired, measures)]
    parts = [
        _header(path, result.command),
        _verdict(verdict),
        html.element("h3", html.text(f"{', '.join(measures)}: mean ± SE over seeds, in %")),
        html.table(headers, rows, caption=headline_note(measures)),
        html.figure(figure, f"{result.command} figure"),
        html.rich_table(per_seed_table(result.per_seed, headline, f"{headline} per seed (%)")),
        html.rich_table(
            audit_table(summary, paired, f"cdscope {result.command}: mean ± SE over seeds")
        ),
    ]
    if len(result.convergence):
        parts.append(html.rich_table(convergence_table(result.convergence)))
    if result.notes:
        parts.append(
            html.element("p", html.text("notes: " + "; ".join(result.notes)), class_="note")
        )
    parts.append(_metadata(result.metadata))
    return "".join(parts)


def _sample_rows(samples: pd.DataFrame) -> list[list[str]]:
    """Per model: problems, samples, share passed, empty completions, mean generated tokens."""
    rows = []
    for model, group in samples.groupby("model", sort=False):
        empty = group["completion"].fillna("").str.strip().eq("").sum()
        rows.append([
            short_model_name(str(model)), str(group["problem_id"].nunique()), str(len(group)),
            f"{100 * group['passed'].mean():.1f}", str(int(empty)),
            f"{group['generated_tokens'].mean():.1f}",
        ])  # fmt: skip
    return rows


def eval_section(path: Path, tables: dict[str, pd.DataFrame], metadata: dict, figure: Any) -> str:
    """An evaluation: pass@k figure and table, per-model sample counts, metadata."""
    parts = [_header(path, "eval")]
    passk, samples = tables.get("passk"), tables.get("samples")
    if figure is not None:
        parts.append(html.figure(figure, "pass@k figure"))
    if passk is not None and len(passk):
        parts.append(html.rich_table(passk_table(passk)))
    if samples is not None and len(samples):
        headers = ["model", "problems", "samples", "passed (%)", "empty", "mean tokens"]
        parts += [html.element("h3", "samples"), html.table(headers, _sample_rows(samples))]
    parts.append(_metadata(metadata))
    return "".join(parts)


def setting_name(field: str) -> str:
    """A training setting as the user sets it: its option without dashes (``lam`` ->
    ``lambda``, ``prompts_per_step`` -> ``prompts-per-step``), else the field's name."""
    import dataclasses

    from cdscope.settings.training import TrainConfig, flag_of

    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if "flag" in f.metadata}
    return flag_of(fields[field]).removeprefix("--") if field in fields else field


def train_section(
    path: Path, tables: dict[str, pd.DataFrame], metadata: dict, figure: Any, evidence: Any = None
) -> str:
    """A training run: the curves, the held-out evidence (figure and table, when taken),
    the per-step table, the run's settings and model."""
    config = metadata.get("config") or {}
    log = tables["log"]
    arm = str(config.get("regularizer", ""))
    parts = [_header(path, "train")]
    if len(log):
        last = log.iloc[-1]
        summary = (
            f"{len(log)} step(s) of {config.get('steps', '?')}; last step: reward "
            f"{last['reward']:.3f}, B_shared(C) on the probe {100 * last['b_shared_before']:.2f}% "
            f"-> {100 * last['b_shared_after']:.2f}%"
            + (f" (tau {config['tau']:g}%)" if arm == "cdrft" and "tau" in config else "")
        )
        parts.append(html.element("p", html.text(summary)))
    if figure is not None:
        parts.append(html.figure(figure, "training curves"))
    if evidence is not None:
        disjoint = metadata.get("audit_disjoint")
        note = {True: "the audit probe shares no item with the training probe",
                False: "the audit probe SHARES items with the training probe",
                None: "no audit probe"}[disjoint]  # fmt: skip
        parts.append(html.element("h3", "held-out evidence"))
        parts.append(html.element("p", html.text(f"{note} (audit_disjoint: {disjoint})")))
        parts.append(html.figure(evidence, "held-out evidence"))
        parts.append(html.rich_table(evidence_table(log, tables.get("audit"), tables.get("eval"))))
    if len(log):
        parts.append(html.rich_table(train_table(log, arm)))
    if config:
        keys = ("model", "backend", "regularizer", "steps", "prompts_per_step", "group_size", "lr",
                "beta", "lam", "tau", "k_max", "eta_proj", "proj_max_norm", "eps", "estimator",
                "granularity", "probe_n", "seed", "dtype", "report_to")  # fmt: skip
        rows = [[setting_name(k), str(config[k])] for k in keys if k in config]
        parts += [html.element("h3", "settings"), html.table(["setting", "value"], rows)]
    parts.append(_metadata(metadata))
    return "".join(parts)


def report_page(sections: Sequence[tuple[str, str, str, Any]]) -> str:
    """The whole page from ``(path, kind, section html, verdict)`` per run."""
    verdicts = [v for *_, v in sections if v is not None]
    failed = [v for v in verdicts if v.failed]
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    head = [
        html.element("h1", "cdscope report"),
        html.element(
            "p",
            html.text(f"{len(sections)} run(s); cdscope {__version__}; written {created}"),
            class_="note",
        ),  # fmt: skip
    ]
    if verdicts:
        summary = (f"FAIL: {len(failed)} of {len(verdicts)} audit(s) above their --fail-above"
                   if failed else f"PASS: {len(verdicts)} audit(s) within their --fail-above")  # fmt: skip
        head.append(
            html.element(
                "div", html.text(summary), class_=f"verdict {'fail' if failed else 'pass'}"
            )
        )
    links = "".join(
        html.element("li", html.element("a", html.text(f"{kind}: {path}"), href=f"#{_anchor(i)}"))
        for i, (path, kind, _, _) in enumerate(sections)
    )
    head.append(html.element("ul", links))
    body = "".join(
        html.element("section", content, id=_anchor(i))
        for i, (_, _, content, _) in enumerate(sections)
    )
    return html.page("cdscope report", "".join(head) + body)
