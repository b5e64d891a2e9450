"""``cdscope train``: validate a run's inputs, load the model, build the probe, run a backend.

Everything a user can get wrong is checked here, before the model loads where possible,
each with one ``CdscopeError`` line: malformed task files (``tasks.load_tasks``), a probe
family without training tasks, ``--tau`` outside [100/M, 100], non-positive sizes, an
output folder that cannot be written or already holds a run (without ``--resume``), a
second run writing the same folder (``lock.OutputLock``), and a ``--resume`` whose probe,
task files or model differ in content from the run it continues (``check_resumed_run``).
The hf backend is ``train.loop``; the trl backend is ``integrations.trl``.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from cdscope.commands.workflow import model_record
from cdscope.core.models.hub import check_model_spec
from cdscope.core.probes import draw_probe, load_pool, split_pool
from cdscope.core.routing import RoutingCount
from cdscope.distributed import (
    is_main_process,
    launch_env,
    process_group,
    rank_device,
    single_process_only,
)
from cdscope.errors import CdscopeError
from cdscope.io import check_writable, content_hash, read_parquet, run_metadata
from cdscope.lock import OutputLock
from cdscope.messages import dim, make_console, warn
from cdscope.settings.names import TRAIN_AUTO_DTYPE
from cdscope.settings.training import TrainConfig
from cdscope.tasks import Task, default_task_paths, load_tasks
from cdscope.train.loop import train_hf
from cdscope.train.run import LOG_NAME, TrainInputs, TrainResult
from cdscope.train.tracking import require_tracker

if TYPE_CHECKING:
    import pandas as pd


def load_training_tasks(cfg: TrainConfig) -> list[Task]:
    paths = list(cfg.tasks) if cfg.tasks else default_task_paths("train")
    return load_tasks(paths)


def check_families(tasks: Sequence[Task], probe_families: Sequence[str]) -> list[str]:
    """The sorted training families; every probe family must have training tasks."""
    families = sorted({t.family for t in tasks})
    missing = [f for f in probe_families if f not in families]
    if missing:
        raise CdscopeError(
            f"probe family/families {', '.join(missing)} have no training tasks (training mix: "
            f"{', '.join(families)}); add tasks for them with --tasks or restrict the probe "
            "with --probe"
        )
    return families


def training_dtype(dtype: str) -> str:
    """``auto`` trains in ``settings.names.TRAIN_AUTO_DTYPE`` (float32) on every device.

    Pure bf16 training rounds most AdamW updates away (lr 2e-6 times a unit step is far
    below bf16's relative spacing 2^-8 at typical weights), and the first-order
    regulariser's gate steps eps * Ŵ are lost in bf16 (``regularizer.check_realised_perturbation``).
    """
    return TRAIN_AUTO_DTYPE if dtype == "auto" else dtype


def _policy(cfg: TrainConfig, model: Any, tokenizer: Any, console: Console | None) -> Any:
    """The model to train: ``cfg.model`` loaded in the training dtype (under a launcher,
    the TRL backend's, each rank on its own GPU), or the caller's ``model`` as it is."""
    from cdscope.core.models.opening import ModelOptions, open_model

    if model is None:
        options = ModelOptions(
            rank_device(cfg.device), training_dtype(cfg.dtype), cfg.attn,
            revision=cfg.revision, trust_remote_code=cfg.trust_remote_code,
        )  # fmt: skip
        return open_model(cfg.model, options=options, console=console)
    return open_model(model, tokenizer, name=cfg.model)


def prepare(
    cfg: TrainConfig,
    console: Console | None = None,
    model: Any = None,
    tokenizer: Any = None,
    reward_fn: Callable[[Sequence[Task], Sequence[str]], list[float]] | None = None,
) -> TrainInputs:
    """Validate ``cfg`` and build everything the loop needs.

    ``model`` / ``tokenizer`` (both or neither) are wrapped, not loaded (``open_model``) —
    for tests and for callers that already hold a model; ``reward_fn`` replaces the
    verifier rewards.
    """
    import torch

    from cdscope.core.generation import ensure_pad_token
    from cdscope.core.regularizer import check_step_resolution
    from cdscope.tasks.sandbox import require_sandbox_for
    from cdscope.train.cdrft import build_probe
    from cdscope.train.evidence import plan_evidence

    cfg.validate()
    console = console or make_console()
    tasks = load_training_tasks(cfg)
    whole = load_pool(list(cfg.probe_files) or None)
    pool = split_pool(whole, cfg.probe_split)  # the training probe's half (docs/probes.md)
    families = check_families(tasks, pool.families)
    if reward_fn is None:  # the shared verifiers score the rollouts: code needs the sandbox
        require_sandbox_for(tasks, "train on math and logic task files only (--tasks)")
    cfg.validate(num_probe_families=len(pool.families))
    drawn = [i.id for i in draw_probe(pool, cfg.seed, cfg.probe_n, pool.families)]
    evidence = plan_evidence(cfg, tasks, families, whole, drawn, console)
    check_writable(Path(cfg.out_dir) / LOG_NAME)
    if model is None:
        check_model_spec(cfg.model)  # the embedded model not installed: one line, first
    if model is None and console is not None:  # the first minute of a run, also in a log
        dim(console, f"loading {cfg.model} ...")
    loaded = _policy(cfg, model, tokenizer, console)
    model, tokenizer = loaded.model, loaded.tokenizer
    model_info = model_record(loaded)
    ensure_pad_token(tokenizer)
    dtype = next(model.parameters()).dtype
    if cfg.regularizer == "cdrft" and cfg.estimator != "exact":
        check_step_resolution(cfg.eps, dtype, cfg.estimator == "richardson")
    device = next(model.parameters()).device
    probe = build_probe(
        pool, tokenizer, cfg.seed, cfg.probe_n, pool.families, cfg.template, device,
        cfg.probe_max_tokens,
    )  # fmt: skip
    ref_model = None
    if cfg.beta > 0:  # the frozen initial policy for the k3 KL; only loaded when used
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    metadata = run_metadata(
        "train",
        config=cfg.to_dict(),
        model=model_info,
        probe_hash=pool.hash,
        tasks_hash=content_hash([t.to_record() for t in tasks]),
        probe_files=list(pool.paths),
        probe_families=pool.families,
        probe_split=pool.split,
        probe_items=probe.item_ids,
        training_families=families,
        num_tasks=len(tasks),
        device=str(device),
        **{"audit_probe_items": [], "audit_disjoint": None, **evidence.metadata},
    )
    return TrainInputs(
        cfg, model, tokenizer, tasks, families, probe, metadata, ref_model, reward_fn, evidence
    )


def run_train(
    cfg: TrainConfig,
    resume: bool = False,
    console: Console | None = None,
    *,
    stop_after: int | None = None,
    model: Any = None,
    tokenizer: Any = None,
    reward_fn: Callable[[Sequence[Task], Sequence[str]], list[float]] | None = None,
) -> TrainResult:
    """Validate, prepare and run ``cfg`` on its backend (hf loop or TRL).

    ``--sharding fsdp`` runs the hf loop on every rank of a launch, inside the launch's
    process group (joined here, destroyed at the end)."""
    cfg.validate()
    if cfg.sharding == "fsdp":
        launch = launch_env()
        if "MASTER_ADDR" not in os.environ:
            raise CdscopeError(
                "--sharding fsdp shards the model over the ranks of a launch: start it with "
                "torchrun --nproc_per_node N -m cdscope.cli -- train ... (docs/distributed.md)"
            )
        from cdscope.core.models.loading import resolve_device

        with process_group(launch, resolve_device(rank_device(cfg.device)).type):
            return _run(cfg, resume, console, stop_after, model, tokenizer, reward_fn)
    if cfg.backend != "trl":  # the built-in loop is one process; TRL shards under a launcher
        single_process_only(f"train --backend {cfg.backend}")
    return _run(cfg, resume, console, stop_after, model, tokenizer, reward_fn)


def _run(
    cfg: TrainConfig,
    resume: bool,
    console: Console | None,
    stop_after: int | None,
    model: Any,
    tokenizer: Any,
    reward_fn: Callable[[Sequence[Task], Sequence[str]], list[float]] | None,
) -> TrainResult:
    console = console or make_console()
    if cfg.extra.get("trl") and cfg.backend != "trl":
        raise CdscopeError("--trl-arg only applies with --backend trl")
    if cfg.backend == "trl":  # before loading anything: the extra may be missing
        from cdscope.integrations.trl import require_trl, require_vllm

        require_trl()
        if cfg.extra.get("trl", {}).get("use_vllm"):
            require_vllm()  # vLLM rollouts need CUDA and vLLM: one line, before the model
    require_tracker(cfg.report_to)  # --report-to: the tracker's package, before the model
    # one writer per run folder (rank 0 only under a launcher: the TRL ranks share it)
    lock = OutputLock(cfg.out_dir) if is_main_process() else contextlib.nullcontext()
    with lock:
        inputs = prepare(cfg, console, model, tokenizer, reward_fn)
        if resume:
            check_resumed_run(Path(cfg.out_dir), inputs.metadata, console)
        if cfg.backend == "trl":
            from cdscope.integrations.trl import train_with_trl

            extra = cfg.extra.get("trl", {})
            result = train_with_trl(inputs, resume=resume, console=console, **extra)
        else:
            result = train_hf(inputs, resume=resume, console=console, stop_after=stop_after)
    if is_main_process():
        say_routing(result.log, console)
    return result


def say_routing(log: pd.DataFrame, console: Console) -> None:
    """MoE models: how many routing decisions the run's first-order regulariser estimates
    held at the nominal experts (``core.routing``; log columns ``routing_*``), and a
    warning where some could not be held (a router without top-k, PhiMoE's): there the
    estimate is not the derivative of R, and ``--estimator exact`` is."""
    if "routing_decisions" not in log or not len(log):
        return
    held = RoutingCount(
        *(int(log[f"routing_{k}"].sum()) for k in ("decisions", "switched", "unheld"))
    )
    if held.unheld:
        warn(console, f"MoE routing: {held.describe()}; the regulariser's gradient crossed "
             "routing switches it could not hold; use --estimator exact")  # fmt: skip
    elif held.decisions:
        dim(console, f"MoE routing: {held.describe()}")


#: what a resumed run must share with the run it continues, beside the settings the
#: checkpoint compares (``train.checkpoint.check_resumable``): contents, not paths
RUN_IDENTITY = (
    ("probe_hash", "probe content"),
    ("tasks_hash", "training task content"),
    ("eval_tasks_hash", "held-out task content"),
    ("audit_probe_hash", "audit probe content"),
)


def check_resumed_run(out_dir: Path, metadata: dict, console: Console) -> None:
    """``--resume`` continues the run in ``out_dir`` only with the same probe and task
    contents and the same model (content hash, dtype, device type), as recorded in its
    ``log.parquet``; one line naming what changed otherwise. Other library versions or
    thread counts are warned about (the steps taken now round differently)."""
    from cdscope.output.resume import environment_changes, recorded_identity

    log = out_dir / LOG_NAME
    if not log.is_file():
        if any((out_dir / folder).is_dir() for folder in ("checkpoints", "trl")):
            raise CdscopeError(
                f"--resume: {log} is missing, so the inputs of the run in {out_dir} cannot be "
                "checked against this one; start a new --out-dir"
            )
        return  # nothing was logged: the checkpoint check refuses or starts cleanly
    old = read_parquet(log)[1]
    for key, label in RUN_IDENTITY:
        if old.get(key) != metadata.get(key):
            if key == "probe_hash" and "probe_split" not in old:
                raise CdscopeError(
                    f"--resume: the run in {out_dir} drew its probe from the whole pool (it "
                    "predates the train / audit split): resume it with --probe-split all"
                )
            raise CdscopeError(
                f"--resume: the {label} differs from the run in {out_dir} ({old.get(key)} vs "
                f"{metadata.get(key)}): the files were edited or others given; resume with the "
                "same files or start a new --out-dir"
            )
    before, now = recorded_identity(old.get("model") or {}), recorded_identity(metadata["model"])
    if before != now:
        changed = ", ".join(k for k in now if before[k] != now[k])
        raise CdscopeError(
            f"--resume: the model of the run in {out_dir} was {before} but is now {now} "
            f"({changed} changed); resume with the same model or start a new --out-dir"
        )
    changes = environment_changes(old, metadata)
    if changes:
        warn(console, f"--resume: {out_dir} was trained with other libraries or threads "
                      f"({', '.join(changes)}): the steps taken now round differently "
                      "(docs/resume.md)")  # fmt: skip
