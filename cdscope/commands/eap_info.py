"""``cdscope eap-info``: edge-attribution statistics of verified answers (SPEC §6).

For the model (and an optional baseline), on one family's probe draw (n items, seed s;
SPEC §4):

1. **Answer.** Greedy generation (at most ``max_new_tokens``), verified by the shared
   verifier of the item's kind (``cdscope.tasks``: final answer = last ``\\boxed{}`` or
   last "answer is X"; math compared exactly as numbers, logic structurally) and cut
   after that answer statement. Items without an ``answer`` key or with a ``code``
   verifier are counted as unsupported: nothing is executed. With ``use_targets`` the
   probe target stands in for the model's answer (``answer_source = "probe_target"``);
   every item then counts as correct.
2. **Filter.** Sequences (prompt + answer) longer than ``max_tokens`` are skipped and
   counted. With a baseline only the samples both models answer correctly are kept;
   each model is scored on its own answer. No sample left -> CdscopeError (exit 2).
3. **Score.** Edge scores with Loss = mean NLL of the answer tokens (``cdscope.core.eap``),
   then per sample: intensity = mean |s_e|, information complexity = H(|s|/sum|s|) /
   log E, kurtosis = Pearson kurtosis of |s_e|.
4. **Summarise.** Mean over samples with its bootstrap interval (B = 2000, seeded with s;
   ``boot_low`` / ``boot_high``: at the default n = 5 samples its coverage is unknown, so
   it is not stored as a confidence interval, docs/decisions.md); with a baseline the
   paired bootstrap of model - baseline.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress

from cdscope.analysis.stats import bootstrap_ci, paired_bootstrap_ci
from cdscope.commands.workflow import model_record
from cdscope.core.batch import encode_probe, prompt_ids, rows_per_forward
from cdscope.core.eap import (
    STATISTICS,
    EdgeGraph,
    EdgeScores,
    eap_plan,
    edge_scores,
    edge_statistics,
)
from cdscope.core.gating.model import GatedModel
from cdscope.core.generation import finite_logits
from cdscope.core.models import LoadedModel
from cdscope.core.models.architecture import architecture_of, position_limit
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import ProbeItem, ProbePool, draw_probe
from cdscope.distributed import single_process_only
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.io import run_metadata
from cdscope.messages import make_console, progress_bar
from cdscope.settings import EapSettings
from cdscope.tasks.io import probe_verifier_kind, task_from_probe_item
from cdscope.tasks.judging import VERIFIERS, find_final_answer
from cdscope.tasks.judging import verify as verify_task
from cdscope.tasks.record import is_code_kind

COUNT_KEYS = ("drawn", "unsupported", "incorrect", "too_long", "correct")


def extract_answer(completion: str) -> tuple[str, str] | None:
    """``(answer, completion cut after the answer statement)``, or None if there is none."""
    found = find_final_answer(completion)
    if found is None:
        return None
    return found.text, completion[: found.end].rstrip("\n")


def verifiable(item: ProbeItem) -> bool:
    """Items with a stored ``answer`` and a math/logic verifier (code is not run here)."""
    kind = probe_verifier_kind(item)
    return "answer" in item.extra and kind in VERIFIERS and not is_code_kind(kind)


def scored_text(item: ProbeItem, completion: str) -> str | None:
    """The text to score (completion up to its answer statement) if correct, else None."""
    found = extract_answer(completion)
    if found is None or not verify_task(task_from_probe_item(item), completion).passed:
        return None
    return found[1]


@dataclass
class Answers:
    """One model's correct answers (as items whose target is the text to score)."""

    items: dict[str, ProbeItem]
    source: str
    counts: Counter


@torch.no_grad()
def _generate(loaded: LoadedModel, prompt: torch.Tensor, max_new_tokens: int) -> str:
    tok = loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = prompt[None].to(loaded.device)
    limit = position_limit(loaded.model)  # learned positions: stop at the last one
    if limit is not None:
        max_new_tokens = min(max_new_tokens, limit - ids.shape[1])
    out = loaded.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        logits_processor=finite_logits(),
    )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _seq_lengths(loaded: LoadedModel, items: Sequence[ProbeItem]) -> list[int]:
    return encode_probe(items, loaded.tokenizer).lengths.tolist() if items else []


def answer(
    loaded: LoadedModel, items: Sequence[ProbeItem], settings: EapSettings, progress: Progress
) -> Answers:
    """Correct answers of ``loaded`` to ``items`` that fit in ``max_tokens`` (step 1-2)."""
    counts = Counter(drawn=len(items))
    # sequences longer than the model's positions (learned absolute positions) are too long
    max_tokens = min(settings.max_tokens, position_limit(loaded.model) or settings.max_tokens)
    candidates: list[ProbeItem] = []
    task = progress.add_task(f"answering ({loaded.name})", total=len(items))
    for item in items:
        progress.advance(task)
        if settings.use_targets:
            candidates.append(item)
            continue
        if not verifiable(item):
            counts["unsupported"] += 1
            continue
        prompt = torch.tensor(prompt_ids(loaded.tokenizer, item.prompt))  # plain template
        if len(prompt) >= max_tokens:
            counts["too_long"] += 1
            continue
        scored = scored_text(item, _generate(loaded, prompt, settings.max_new_tokens))
        if scored is None or not scored.strip():
            counts["incorrect"] += 1
            continue
        candidates.append(replace(item, target=scored))
    progress.remove_task(task)
    kept = {}
    for item, length in zip(candidates, _seq_lengths(loaded, candidates), strict=True):
        if length > max_tokens:
            counts["too_long"] += 1
        else:
            kept[item.id] = item
    counts["correct"] = len(kept)
    return Answers(kept, "probe_target" if settings.use_targets else "generated", counts)


def _check_compatible(models: Sequence[LoadedModel]) -> None:
    """Both models must give the same graph: same architecture, nodes, paths and edges."""
    graphs = [EdgeGraph.from_plan(architecture_of(m.model), eap_plan(m.model)) for m in models]
    if len(models) != 2:
        return
    (a, b), (ma, mb) = models, (m.model.config.model_type for m in models)
    if ma != mb or graphs[0].edges() != graphs[1].edges():
        raise CdscopeError(
            f"--baseline {b.name!r} ({mb}, L = {b.num_layers}, E = {graphs[1].E}) does not "
            f"match --model {a.name!r} ({ma}, L = {a.num_layers}, E = {graphs[0].E}): their "
            "edges would not align"
        )


def _no_samples_error(family: str, runs: Sequence[tuple[str, Answers]]) -> CdscopeError:
    parts = []
    for name, answers in runs:
        counts = answers.counts
        parts.append(
            f"{name}: " + ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in COUNT_KEYS)
        )
    hint = "" if runs[0][1].source == "probe_target" else "; --use-targets scores the probe targets"
    both = " by both models" if len(runs) == 2 else ""
    return CdscopeError(
        f"family {family!r}: no sample answered correctly{both} within --max-tokens "
        f"({'; '.join(parts)}){hint}"
    )


def sample_frame(
    name: str, family: str, source: str, ids: Sequence[str], result: EdgeScores, lengths: list[int]
) -> pd.DataFrame:
    """One row per sample: the three statistics and what they were computed on."""
    stats = edge_statistics(result.scores)
    return pd.DataFrame(
        {
            "model": name,
            "sample_id": list(ids),
            "family": family,
            "answer_source": source,
            **{key: stats[key] for key in STATISTICS},
            "n_tokens": result.n_answer_tokens.astype(int),
            "seq_tokens": lengths,
            "loss": result.loss,
        }
    )


def edge_frame(name: str, result: EdgeScores) -> pd.DataFrame:
    """The mean edge-score matrix in long form (one row per edge)."""
    up, down, path = zip(*result.graph.edges(), strict=True)
    return pd.DataFrame(
        {
            "model": name,
            "upstream": up,
            "downstream": down,
            "path": path,
            "mean_score": result.scores.mean(axis=0),
            "mean_abs_score": np.abs(result.scores).mean(axis=0),
        }
    )


def summarise(
    per_sample: pd.DataFrame,
    names: Sequence[str],
    B: int,
    seed: int,  # noqa: N803
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean and bootstrap interval per (model, statistic); paired differences vs baseline."""
    rows, paired = [], []
    for name in names:
        part = per_sample[per_sample["model"] == name]
        for key in STATISTICS:
            ci = bootstrap_ci(part[key].to_numpy(), B=B, seed=seed)
            rows.append(
                {
                    "model": name,
                    "statistic": key,
                    "mean": ci.estimate,
                    "boot_low": ci.ci_low,
                    "boot_high": ci.ci_high,
                    "n": len(part),
                    "B": B,
                }
            )
    if len(names) == 2:
        a, b = (per_sample[per_sample["model"] == n].set_index("sample_id") for n in names)
        b = b.loc[a.index]
        for key in STATISTICS:
            ci = paired_bootstrap_ci(a[key].to_numpy(), b[key].to_numpy(), B=B, seed=seed)
            paired.append(
                {
                    "model": names[0],
                    "baseline": names[1],
                    "statistic": key,
                    "mean_diff": ci.estimate,
                    "boot_low": ci.ci_low,
                    "boot_high": ci.ci_high,
                    "n": len(a),
                    "B": B,
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(paired)


@dataclass
class EapResult:
    per_sample: pd.DataFrame
    edges: pd.DataFrame
    summary: pd.DataFrame
    paired: pd.DataFrame
    metadata: dict
    graph: object  # cdscope.core.eap.EdgeGraph


def edges_path(out: Path) -> Path:
    """``OUT.edges.parquet`` beside ``OUT.parquet``."""
    return out.with_name(out.name.removesuffix(".parquet") + ".edges.parquet")


def run_eap_info(
    model: str,
    baseline: str | None,
    pool: ProbePool,
    settings: EapSettings,
    options: ModelOptions,
    console: Console | None = None,
) -> EapResult:
    """Answer, filter, score and summarise (module docstring); writes nothing."""
    single_process_only("eap-info")
    console = console or make_console()
    specs = [model] if baseline is None else [model, baseline]
    if len(set(specs)) != len(specs):
        raise CdscopeError("--baseline is the same model as --model")
    items = draw_probe(pool, settings.seed, settings.n, [settings.family])
    with progress_bar(console, transient=True) as progress:
        loaded = []
        for spec in specs:
            loaded.append(options.load(spec, console))
        _check_compatible(loaded)
        answers = [answer(lm, items, settings, progress) for lm in loaded]
        common = [it.id for it in items if all(it.id in a.items for a in answers)]
        if not common:
            raise _no_samples_error(settings.family, list(zip(specs, answers, strict=True)))
        scored = [
            _score(spec, lm, ans, common, settings, progress)
            for spec, lm, ans in zip(specs, loaded, answers, strict=True)
        ]
    per_sample = pd.concat([frame for frame, _, _ in scored], ignore_index=True)
    edges = [edge for _, edge, _ in scored]
    result = scored[-1][2]
    summary, paired = summarise(per_sample, specs, settings.bootstrap, settings.seed)
    metadata = run_metadata(
        "eap-info",
        models=[model_record(lm, GatedModel(lm.model).gate_set) for lm in loaded],
        baseline=baseline,
        family=settings.family,
        n=settings.n,
        seed=settings.seed,
        probe_hash=pool.hash,
        probe_files=list(pool.paths),
        settings={k: v for k, v in vars(settings).items() if k != "family"},
        edges=int(result.graph.E),
        counts={
            spec: {k: a.counts[k] for k in COUNT_KEYS}
            for spec, a in zip(specs, answers, strict=True)
        },
        scored_samples=common,
        summary=summary.to_dict(orient="records"),
        paired=paired.to_dict(orient="records"),
    )
    return EapResult(
        per_sample, pd.concat(edges, ignore_index=True), summary, paired, metadata, result.graph
    )


def _score(
    spec: str, lm: LoadedModel, ans: object, common: list[str], settings: EapSettings,
    progress: Progress,
) -> tuple[pd.DataFrame, pd.DataFrame, object]:  # fmt: skip
    """Edge scores of ``lm`` on its verified answers to the ``common`` items: the
    per-sample frame, the edge frame and the scores (``cdscope.core.eap.edge_scores``)."""
    task = progress.add_task(f"edge scores ({spec})", total=None)
    scored = [ans.items[i] for i in common]
    pad_id = getattr(lm.tokenizer, "pad_token_id", None) or 0
    batch = encode_probe(scored, lm.tokenizer, pad_id=pad_id).to(lm.device)
    batch_size = rows_per_forward(settings.batch_size, lm.device)
    result = edge_scores(lm.model, batch, batch_size)
    lengths = batch.lengths.tolist()
    frame = sample_frame(spec, settings.family, ans.source, common, result, lengths)
    progress.remove_task(task)
    return frame, edge_frame(spec, result), result


def eap_outputs(out: Path, plot: Path | None = None) -> FileSet:
    """The output set of eap-info: per-sample Parquet, edge matrix beside it, figure."""
    return FileSet(out, edges_path(out), plot)


def write_eap_outputs(
    result: EapResult, out: Path, plot: Path | None = None, outputs: FileSet | None = None
) -> dict[str, Path]:
    """Per-sample Parquet at ``out``, the edge matrix beside it and the figure at ``plot``,
    as one output set (``eap_outputs``, or the caller's ``outputs``, already locked
    before the work began): all or none, one writer at a time."""
    edges = edges_path(out)
    metadata = {**result.metadata, "outputs": {"per_sample": str(out), "edges": str(edges)}}
    with contextlib.nullcontext(outputs) if outputs else eap_outputs(out, plot) as files:
        files.write_parquet(result.edges, edges, metadata)
        files.write_parquet(result.per_sample, out, metadata)
        if plot is not None:
            from cdscope.output.plots_eap import plot_eap

            plot_eap(
                files.path(plot), result.graph, result.edges, result.per_sample, result.summary
            )
    return {"per_sample": out, "edges": edges} | ({"plot": plot} if plot is not None else {})
