"""``cdscope eval``: sample, verify and score pass@k for one or more models (SPEC §7).

For each model and each selected problem (the first ``limit`` tasks of every benchmark,
in file order): draw ``n`` completions with the run's engine (``commands.engines``:
transformers, vLLM or an OpenAI-compatible server; a batch of problems per call) under a
seed derived from (run seed, problem id) alone, score them with ``cdscope.tasks.verify_many``
(code only inside the sandbox), and append one row per sample. Because a problem's
samples depend only on its own seed, ``--resume`` skips the problems already in the
per-sample file and the rerun gives exactly the samples an uninterrupted run would have.
Empty completions are failures ("empty completion") without running a verifier.

Outputs in ``out_dir``, written as one set at the end (``cdscope.fileset``; with
``--audit`` the contamination table and with ``--plot`` the figure belong to it):
``samples.parquet`` and ``passk.parquet`` (``cdscope.analysis.passk.summarize``), both
with run metadata. While it runs, the samples so far are rewritten every few seconds to
``samples.partial.parquet`` (and when a model's run fails: a server lost, an interrupt),
which ``--resume`` continues from; an earlier complete
``samples.parquet`` stays as it was until the new set is complete. Each problem's content
hash (``task_hash``) is recorded, so an edited task is never resumed silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.analysis.passk import check_ks, summarize
from cdscope.commands.engines import Server, check_engine, connect, identity_for, open_engine
from cdscope.commands.requests import EvalRequest
from cdscope.commands.workflow import distinct_models, load_record
from cdscope.core.engines import Generation
from cdscope.core.models.opening import ModelOptions
from cdscope.distributed import single_process_only
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import check_writable, content_hash, run_metadata, write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.resume import resume_state
from cdscope.settings import EvalSettings
from cdscope.tasks.evaluation import (
    gen_request,
    sample_rows,
    score_completions,
    select,
)
from cdscope.tasks.io import audit, items_from_tasks, reference_sets
from cdscope.tasks.sandbox import require_sandbox_for

COMPLETION_COLUMNS = [
    "model",
    "benchmark",
    "domain",
    "problem_id",
    "sample",
    "completion",
    "passed",
    "message",
    "generated_tokens",
]
WRITE_EVERY_S = 10.0


@dataclass
class EvalResult:
    samples: pd.DataFrame
    passk: pd.DataFrame
    stats: pd.DataFrame  # per model: problems, samples, tokens, tokens/s, verify share, empty
    metadata: dict
    models: list[str] = field(default_factory=list)  # the models evaluated, in order


def eval_outputs(
    out_dir: Path, models: bool = True, audit: bool = False, plot: Path | None = None
) -> FileSet:
    """The output set of one ``eval`` run: samples and pass@k (when models run), the
    contamination audit (``--audit``) and the figure; committed together."""
    files = ["samples.parquet", "passk.parquet"] if models else []
    files += ["contamination.parquet"] if audit else []
    return FileSet(*(out_dir / name for name in files), plot)


def task_hash(task: object) -> str:
    """A task's content identity: every field of its record (prompt, answer, tests,
    verifier, ...); what ``--resume`` compares per problem."""
    return content_hash(task.to_record())  # type: ignore[attr-defined]


def read_hard_ids(path: Path, tasks: Sequence) -> set[str]:
    """Task ids (one per line, '#' comments) marking the hard subset; all must be known."""
    if not path.is_file():
        raise CdscopeError(f"--hard file not found: {path}")
    ids = {
        line.split("#", 1)[0].strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.split("#", 1)[0].strip()
    }
    if not ids:
        raise CdscopeError(f"--hard file {path} lists no task ids (one id per line)")
    unknown = sorted(ids - {t.id for t in tasks})
    if unknown:
        raise CdscopeError(
            f"--hard: {len(unknown)} id(s) in {path} match no loaded task "
            f"(first: {unknown[0]!r}); use ids from the --tasks files"
        )
    return ids


def contamination_audit(
    tasks: Sequence,
    task_paths: Sequence[Path],
    train_paths: Sequence[Path] | None,
    probe_paths: Sequence[Path] | None,
    out_dir: Path,
    outputs: FileSet | None = None,
    sources: Mapping[str, str] | None = None,
) -> tuple[pd.DataFrame, Path]:
    """``eval --audit``: the eval ``tasks`` against the training tasks and probe pools
    (shipped ones where no paths are given; ``cdscope.tasks.io.contamination``), written to
    ``out_dir/contamination.parquet`` (a file of ``outputs``, the run's output set, when
    given); returns (frame, path). Rows per eval benchmark, as ``select`` names them."""
    target = check_writable(out_dir / "contamination.parquet")
    items = items_from_tasks(tasks, sources)
    frame = audit(items, reference_sets(train_paths, probe_paths))
    metadata = run_metadata(
        "eval --audit",
        task_files=[str(p) for p in task_paths],
        tasks_hash=content_hash([t.to_record() for t in tasks]),
        train_files=[str(p) for p in train_paths or []] or "shipped",
        probe_files=[str(p) for p in probe_paths or []] or "shipped",
    )
    with contextlib.nullcontext(outputs) if outputs else FileSet(target) as files:
        files.write_parquet(frame, target, metadata)
    return frame, target


def check_backend(backend: str) -> None:
    """``--backend`` by name, and vLLM importable for ``vllm`` (``engines.check_engine``
    checks every engine option together)."""
    check_engine(EvalSettings(backend=backend), ModelOptions(), model_given=False)


def evaluate(
    request: EvalRequest, console: Console | None = None, outputs: FileSet | None = None
) -> EvalResult:
    """Generate, verify and summarise every (model, selected problem); see the module doc.
    The samples and pass@k are written as files of ``outputs`` (the run's output set; one
    of these two files alone when None)."""
    single_process_only("eval")
    console = console or make_console()
    if not request.settings.endpoint:
        distinct_models(request.model_specs)
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(eval_outputs(request.out_dir))
        return _evaluate(request, console, outputs)


def _evaluate(request: EvalRequest, console: Console, outputs: FileSet) -> EvalResult:
    """``evaluate`` inside its output set."""
    settings = request.settings
    ks = check_ks(settings.ks, settings.n)
    check_engine(settings, request.options, model_given=bool(request.model_specs))
    chosen = select(request.tasks, settings.limit, request.task_sources)
    require_sandbox_for([t for t, _ in chosen], "drop the code task files from --tasks")
    server = connect(settings) if settings.endpoint else None
    sampler = _Sampler(request, chosen, ks, console, server)
    outputs.lock()  # before reading what another run may be writing
    done = sampler.resume()
    start_all = time.perf_counter()
    with progress_bar(console) as progress:
        bar = progress.add_task("eval", total=len(sampler.specs) * len(chosen))
        stats = [sampler.model(spec, done, progress, bar) for spec in sampler.specs]
    samples, passk = sampler.write(outputs)
    stats_frame = pd.DataFrame(stats)
    stats_frame["tokens_per_s"] = stats_frame["tokens"] / stats_frame["generate_s"].where(
        stats_frame["generate_s"] > 0
    )
    stats_frame["verify_share"] = stats_frame["verify_s"] / stats_frame["wall_s"].where(
        stats_frame["wall_s"] > 0
    )
    sampler.metadata["wall_s"] = time.perf_counter() - start_all
    return EvalResult(samples, passk, stats_frame, sampler.metadata, sampler.specs)


class _Sampler:
    """One eval run's samples so far and its metadata: the models are sampled one after
    the other, a batch of problems per engine call (``Engine.per_call``), the progress
    file rewritten every ``WRITE_EVERY_S`` seconds and when a model's run fails."""

    def __init__(
        self, request: EvalRequest, chosen: list, ks: list[int], console: Console,
        server: Server | None = None,
    ) -> None:  # fmt: skip
        self.request, self.chosen, self.ks, self.console = request, chosen, ks, console
        self.server = server
        #: the models of this run: the --model specs, or the served model of --endpoint
        self.specs = [server.name] if server else list(request.model_specs)
        self.samples_path = request.out_dir / "samples.parquet"
        self.hashes = {t.id: task_hash(t) for t, _ in chosen}
        ids = "\n".join(t.id for t, _ in chosen).encode()
        endpoint = {"endpoint": server.client.url} if server else {}  # type: ignore[attr-defined]
        self.metadata = run_metadata(
            "eval",
            settings=request.settings.comparable(),
            load=load_record(request.options),
            ks=ks,
            limit=request.settings.limit,
            task_ids_hash=hashlib.sha256(ids).hexdigest()[:16],
            task_hashes=self.hashes,
            models=[],
            **endpoint,
        )
        self.frames: list[pd.DataFrame] = []

    def resume(self) -> set[tuple]:
        """The (model, problem) pairs kept from ``--resume`` (their rows kept too)."""
        state = resume_state(
            self.samples_path, self.metadata, self.specs, self.request.options,
            self.request.resume, self.console, "problem_id", item_hashes=self.hashes,
            identity=identity_for(self.server),
        )  # fmt: skip
        self.metadata["models"] = state.models
        if state.frame is not None:  # problems kept but not chosen now: their hashes too
            self.frames.append(state.frame)
            kept = state.metadata.get("task_hashes") or {}
            self.metadata["task_hashes"] = {
                **{i: kept[i] for i in dict.fromkeys(state.frame["problem_id"]) if i in kept},
                **self.hashes,
            }
        return state.done

    def write_progress(self) -> None:
        """The samples so far to the progress file (what ``--resume`` continues from)."""
        if self.frames:
            frame = pd.concat(self.frames, ignore_index=True)
            write_parquet(frame, partial_path(self.samples_path), self.metadata)

    def model(self, spec: str, done: set[tuple], progress: object, bar: object) -> dict:
        """Sample and verify ``spec``'s unfinished problems; its statistics record."""
        todo = [(t, b) for t, b in self.chosen if (spec, t.id) not in done]
        progress.advance(bar, len(self.chosen) - len(todo))
        record = dict(model=spec, problems=len(todo), samples=0, tokens=0, empty=0)
        record.update(generate_s=0.0, verify_s=0.0, wall_s=0.0)
        if not todo:
            return record
        progress.phase(bar, f"loading {spec}")
        t_model = time.perf_counter()
        engine, model_entry = open_engine(spec, self.request, self.server, self.console)
        models = [m for m in self.metadata["models"] if m["name"] != spec]
        self.metadata["models"] = [*models, model_entry]
        last_write = time.perf_counter()
        try:
            for lo in range(0, len(todo), engine.per_call):
                chunk = todo[lo : lo + engine.per_call]
                t0 = time.perf_counter()
                generations = engine.generate(
                    [gen_request(task, self.request.settings) for task, _ in chunk]
                )
                record["generate_s"] += time.perf_counter() - t0
                for (task, bench), generation in zip(chunk, generations, strict=True):
                    self.problem(spec, task, bench, generation, record)
                rate = record["tokens"] / max(record["generate_s"], 1e-9)
                progress.update(bar, description=f"{spec} {rate:.0f} tok/s")
                progress.advance(bar, len(chunk))
                if time.perf_counter() - last_write > WRITE_EVERY_S:  # progress, for --resume
                    self.write_progress()
                    last_write = time.perf_counter()
        except BaseException:
            self.write_progress()  # the problems finished so far survive a failed run
            raise
        finally:
            engine.close()
        record["wall_s"] = time.perf_counter() - t_model
        return record

    def problem(
        self, spec: str, task: object, bench: str, generation: Generation, record: dict
    ) -> None:
        """The completions of one problem, verified, as rows; ``record`` counts them."""
        texts = generation.texts
        t1 = time.perf_counter()
        verdicts = score_completions([task] * len(texts), texts, self.request.settings)
        record["verify_s"] += time.perf_counter() - t1
        record["tokens"] += int(generation.total_tokens)
        record["samples"] += len(texts)
        record["empty"] += sum(not t.strip() for t in texts)
        self.frames.append(sample_rows(spec, task, bench, generation, verdicts))

    def write(self, outputs: FileSet) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Write samples and pass@k into ``outputs``; the chosen models' and problems'
        samples and the pass@k table."""
        frames = self.frames
        samples = (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=COMPLETION_COLUMNS)
        )
        # a problem's benchmark as named now: rows kept by --resume from a file written
        # before each --tasks file was a benchmark of its own get today's name
        benchmark = {t.id: b for t, b in self.chosen}
        samples["benchmark"] = samples["problem_id"].map(benchmark).fillna(samples["benchmark"])
        outputs.write_parquet(samples, self.samples_path, self.metadata)
        outputs.remove_on_commit(partial_path(self.samples_path))
        wanted = samples["model"].isin(self.specs) & samples["problem_id"].isin(
            [t.id for t, _ in self.chosen]
        )
        hard_ids = self.request.hard_ids
        passk = summarize(samples[wanted], self.ks, hard_ids)
        hard = {"hard_ids_hash": content_hash(sorted(hard_ids)) if hard_ids else None}
        files = self.metadata | {"samples_file": str(self.samples_path)} | hard
        outputs.write_parquet(passk, self.request.out_dir / "passk.parquet", files)
        return samples[wanted].reset_index(drop=True), passk
