"""``cdscope eval``: sample, verify and score pass@k for one or more models (SPEC §7).

For each model and each selected problem (the first ``limit`` tasks of every benchmark,
in file order): draw ``n`` completions with ``cdscope.core.generation.sample`` under a seed
derived from (run seed, problem id) alone, score them with ``cdscope.tasks.verify_many``
(code only inside the sandbox), and append one row per sample. Because a problem's
samples depend only on its own seed, ``--resume`` skips the problems already in the
per-sample file and the rerun gives exactly the samples an uninterrupted run would have.
Empty completions are failures ("empty completion") without running a verifier.

Outputs in ``out_dir``, written as one set at the end (``cdscope.fileset``; with
``--audit`` the contamination table and with ``--plot`` the figure belong to it):
``samples.parquet`` and ``passk.parquet`` (``cdscope.analysis.passk.summarize``), both
with run metadata. While it runs, the samples so far are rewritten every few seconds to
``samples.partial.parquet``, which ``--resume`` continues from; an earlier complete
``samples.parquet`` stays as it was until the new set is complete. Each problem's content
hash (``task_hash``) is recorded, so an edited task is never resumed silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.analysis.passk import check_ks, summarize
from cdscope.commands.requests import EvalRequest
from cdscope.commands.workflow import distinct_models, load_record, model_record
from cdscope.core.evaluation import Generator, problem_samples, select
from cdscope.core.evaluation import hf_generator as model_generator
from cdscope.distributed import single_process_only
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import check_writable, content_hash, run_metadata, write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.resume import resume_state
from cdscope.settings import EvalSettings
from cdscope.tasks.contamination import audit, items_from_tasks, reference_sets
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
) -> tuple[pd.DataFrame, Path]:
    """``eval --audit``: the eval ``tasks`` against the training tasks and probe pools
    (shipped ones where no paths are given; ``cdscope.tasks.contamination``), written to
    ``out_dir/contamination.parquet`` (a file of ``outputs``, the run's output set, when
    given); returns (frame, path)."""
    target = check_writable(out_dir / "contamination.parquet")
    frame = audit(items_from_tasks(tasks), reference_sets(train_paths, probe_paths))
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
    if backend not in ("hf", "vllm"):
        raise CdscopeError(f"--backend must be hf or vllm, got {backend!r}")
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise CdscopeError(
            "--backend vllm needs the vllm package (pip install vllm, on a CUDA machine); "
            "use --backend hf here"
        )


def hf_generator(loaded: object, settings: EvalSettings) -> Generator:
    """(prompt, max_new_tokens, seed) -> n completions and their token counts, via HF."""
    return model_generator(loaded.model, loaded.tokenizer, settings)  # type: ignore[attr-defined]


def vllm_generator(loaded: object, settings: EvalSettings) -> Generator:  # pragma: no cover
    """The same contract through vLLM (GPU machines; not exercised on CPU-only hosts)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=loaded.source, dtype=str(loaded.dtype).removeprefix("torch."))  # type: ignore[attr-defined]

    def generate(_task: object, prompt: str, max_new: int, seed: int):  # noqa: ANN202
        params = SamplingParams(
            n=settings.n,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_tokens=max_new,
            seed=seed,
        )
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs
        return [o.text for o in out], [len(o.token_ids) for o in out]

    return generate


def evaluate(
    request: EvalRequest, console: Console | None = None, outputs: FileSet | None = None
) -> EvalResult:
    """Generate, verify and summarise every (model, selected problem); see the module doc.
    The samples and pass@k are written as files of ``outputs`` (the run's output set; one
    of these two files alone when None)."""
    single_process_only("eval")
    console = console or make_console()
    distinct_models(request.model_specs)
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(eval_outputs(request.out_dir))
        return _evaluate(request, console, outputs)


def _evaluate(request: EvalRequest, console: Console, outputs: FileSet) -> EvalResult:
    """``evaluate`` inside its output set."""
    settings = request.settings
    ks = check_ks(settings.ks, settings.n)
    check_backend(settings.backend)
    chosen = select(request.tasks, settings.limit)
    require_sandbox_for([t for t, _ in chosen], "drop the code task files from --tasks")
    sampler = _Sampler(request, chosen, ks, console)
    outputs.lock()  # before reading what another run may be writing
    done = sampler.resume()
    start_all = time.perf_counter()
    with progress_bar(console) as progress:
        bar = progress.add_task("eval", total=len(request.model_specs) * len(chosen))
        stats = [sampler.model(spec, done, progress, bar) for spec in request.model_specs]
    samples, passk = sampler.write(outputs)
    stats_frame = pd.DataFrame(stats)
    stats_frame["tokens_per_s"] = stats_frame["tokens"] / stats_frame["generate_s"].where(
        stats_frame["generate_s"] > 0
    )
    stats_frame["verify_share"] = stats_frame["verify_s"] / stats_frame["wall_s"].where(
        stats_frame["wall_s"] > 0
    )
    sampler.metadata["wall_s"] = time.perf_counter() - start_all
    return EvalResult(samples, passk, stats_frame, sampler.metadata)


class _Sampler:
    """One eval run's samples so far and its metadata: the models are sampled one after
    the other, the progress file rewritten every ``WRITE_EVERY_S`` seconds."""

    def __init__(self, request: EvalRequest, chosen: list, ks: list[int], console: Console) -> None:
        self.request, self.chosen, self.ks, self.console = request, chosen, ks, console
        self.samples_path = request.out_dir / "samples.parquet"
        self.hashes = {t.id: task_hash(t) for t, _ in chosen}
        ids = "\n".join(t.id for t, _ in chosen).encode()
        self.metadata = run_metadata(
            "eval",
            settings=request.settings.comparable(),
            load=load_record(request.options),
            ks=ks,
            limit=request.settings.limit,
            task_ids_hash=hashlib.sha256(ids).hexdigest()[:16],
            task_hashes=self.hashes,
            models=[],
        )
        self.frames: list[pd.DataFrame] = []

    def resume(self) -> set[tuple]:
        """The (model, problem) pairs kept from ``--resume`` (their rows kept too)."""
        state = resume_state(
            self.samples_path, self.metadata, self.request.model_specs, self.request.options,
            self.request.resume, self.console, "problem_id", item_hashes=self.hashes,
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

    def model(self, spec: str, done: set[tuple], progress: object, bar: object) -> dict:
        """Sample and verify ``spec``'s unfinished problems; its statistics record."""
        todo = [(t, b) for t, b in self.chosen if (spec, t.id) not in done]
        progress.advance(bar, len(self.chosen) - len(todo))
        record = dict(model=spec, problems=len(todo), samples=0, tokens=0, empty=0)
        record.update(generate_s=0.0, verify_s=0.0, wall_s=0.0)
        if not todo:
            return record
        progress.update(bar, description=f"loading {spec}")
        t_model = time.perf_counter()
        loaded = self.request.options.load(spec, self.console)
        models = [m for m in self.metadata["models"] if m["name"] != spec]
        self.metadata["models"] = [*models, model_record(loaded)]
        settings = self.request.settings
        generate = (vllm_generator if settings.backend == "vllm" else hf_generator)(
            loaded, settings
        )
        last_write = time.perf_counter()
        for task, bench in todo:
            self.problem(spec, task, bench, generate, record)
            rate = record["tokens"] / max(record["generate_s"], 1e-9)
            progress.update(bar, description=f"{spec} {rate:.0f} tok/s")
            progress.advance(bar)
            if time.perf_counter() - last_write > WRITE_EVERY_S:  # progress, for --resume
                frame = pd.concat(self.frames, ignore_index=True)
                write_parquet(frame, partial_path(self.samples_path), self.metadata)
                last_write = time.perf_counter()
        record["wall_s"] = time.perf_counter() - t_model
        return record

    def problem(
        self, spec: str, task: object, bench: str, generate: Callable, record: dict
    ) -> None:
        """``n`` completions of one problem, verified, as rows; ``record`` counts them."""
        frame, cost = problem_samples(spec, task, bench, generate, self.request.settings)
        for key in ("generate_s", "verify_s", "tokens", "empty"):
            record[key] += cost[key]
        record["samples"] += len(frame)
        self.frames.append(frame)

    def write(self, outputs: FileSet) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Write samples and pass@k into ``outputs``; the chosen models' and problems'
        samples and the pass@k table."""
        frames = self.frames
        samples = (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=COMPLETION_COLUMNS)
        )
        outputs.write_parquet(samples, self.samples_path, self.metadata)
        outputs.remove_on_commit(partial_path(self.samples_path))
        wanted = samples["model"].isin(list(self.request.model_specs)) & samples["problem_id"].isin(
            [t.id for t, _ in self.chosen]
        )
        hard_ids = self.request.hard_ids
        passk = summarize(samples[wanted], self.ks, hard_ids)
        hard = {"hard_ids_hash": content_hash(sorted(hard_ids)) if hard_ids else None}
        files = self.metadata | {"samples_file": str(self.samples_path)} | hard
        outputs.write_parquet(passk, self.request.out_dir / "passk.parquet", files)
        return samples[wanted].reset_index(drop=True), passk
