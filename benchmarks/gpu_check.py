"""Issue 39: one prepared check of the headline path, for the minutes a GPU is lent.

Four independent sections, each timed; one that fails records its one-line error and the
next still runs. The JSON (``--out``) is rewritten after every section, so a run cut off
by its time limit keeps what it finished; the Markdown table goes beside it (``.md``).

- **headline**: a random-init model of Qwen2.5-7B's sizes (no download), built on the
  device, saved with ``save_pretrained`` in bfloat16 and loaded by path with
  ``--dtype auto``; the proof at load, then ``cdscope.bshared`` (the workflow of
  ``cdscope bshared``) on probe seeds 0 and 1: K, B_shared per seed, seconds per seed, the
  time of one C against one no-grad forward of the same probe, peak GPU memory. If the
  whole probe in one batch (the GPU default) does not fit, the OOM is recorded and the
  measurement repeated one row per forward.
- **precision**: a random-init Qwen2.5-1.5B geometry in float32 + sdpa, bfloat16 + sdpa and
  bfloat16 + flash_attention_2 (refused with its reason where flash-attn is absent):
  B_shared per seed against float32, worst C-row cosine (``precision_gpu.measure``).
- **training**: one GRPO step against one CD-RFT step on that model (float32, the training
  dtype; bfloat16 CD-RFT is tried too and its refusal recorded), 8 prompts x G = 4, and the
  CD-RFT step's peak memory with and without ``--activation-checkpointing``. Random weights
  solve nothing, so rewards come from a fixed hash of each completion (half pass): the
  advantages are those of a learning run, not all zero.
- **generation**: ``cdscope eval``'s hf backend on the shipped math eval set at 1.5B,
  bfloat16: generated tokens per second.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json        # ~5 min on one H100
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu.json    # tiny configs, CPU, < 2 min

docs/gpu.md gives the device command line and what to do with the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # precision_gpu beside this file

import precision_gpu  # noqa: E402

#: Qwen2.5-7B's published sizes (7.6e9 parameters), K = 56
QWEN_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
QWEN_1P5B = precision_gpu.LARGE
#: the dry run's stand-ins: the same architecture, a few thousand parameters
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=4096,
)
SECTIONS = ("headline", "precision", "training", "generation")
TRAIN_RUNS = ("grpo", "cdrft", "cdrft_checkpointing", "cdrft_bfloat16")


def one_line(exc: BaseException) -> str:
    """The error as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def hashed_reward(tasks, completions) -> list[float]:  # noqa: ANN001
    """A fixed reward that half the completions earn (random weights solve nothing)."""
    return [float(hashlib.sha256(c.encode()).digest()[0] % 2) for c in completions]


class Check:
    """The run: its options, results so far, and the files it rewrites after each section."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.start = time.perf_counter()
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        if args.log:
            Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        self.log = open(args.log, "w") if args.log else io.StringIO()  # noqa: SIM115
        self.results: dict = {"environment": environment(args), "sections": {}}
        self.models: dict[str, Path] = {}

    def left_s(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.start)

    def section(self, name: str, body: Callable[[], dict], needs_s: float) -> None:
        """Run one section; its result, or its one-line error, or why it was skipped."""
        if name not in self.args.sections:
            return
        if self.left_s() < needs_s:
            self.results["sections"][name] = {
                "skipped": f"{self.left_s():.0f} s of the budget left, section needs ~{needs_s:.0f}"
            }
            self.write()
            return
        print(f"[{time.perf_counter() - self.start:6.1f} s] {name} ...", flush=True)
        begin = time.perf_counter()
        try:
            result = body()
        except Exception as exc:  # noqa: BLE001 - every section is independent
            traceback.print_exc(file=self.log)
            result = {"error": one_line(exc)}
        result["seconds"] = round(time.perf_counter() - begin, 1)
        self.results["sections"][name] = result
        print(f"  {name}: {json.dumps(result, default=str)[:1500]}", flush=True)
        self.write()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def build(self, name: str, sizes: dict) -> Path:
        """A random-init Qwen2 of ``sizes``, built on the device, saved in bfloat16 with
        the tokenizer of ``--tokenizer`` (else the byte tokenizer): loaded by path after."""
        if name in self.models:
            return self.models[name]
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from cdscope.tools import tiny

        tokenizer = (
            AutoTokenizer.from_pretrained(self.args.tokenizer)
            if self.args.tokenizer
            else tiny.byte_tokenizer()
        )
        torch.manual_seed(0)
        vocab = max(sizes["vocab_size"], len(tokenizer))  # the dry run's tiny vocabulary
        config = AutoConfig.for_model("qwen2", **{**sizes, "vocab_size": vocab})
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        directory = self.tmp / name
        model.save_pretrained(directory)
        del model
        tokenizer.save_pretrained(directory)
        self.models[name] = directory
        return directory

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.results, indent=1, default=str))
        out.with_suffix(".md").write_text(markdown(self.results))


def environment(args: argparse.Namespace) -> dict:
    import transformers

    from cdscope.version import __version__

    env = {
        "dry_run": args.dry_run,
        "device": args.device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cdscope": __version__,
        "tokenizer": args.tokenizer or "byte tokenizer (tools.tiny)",
    }
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": props.name,
            "gpu_memory_GiB": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
        }
    return env


def headline(check: Check) -> dict:
    """The 7B geometry in bf16 by path: proof, B_shared per seed, C vs forward, memory."""
    import cdscope
    from cdscope.core.models import architecture_of

    sizes = TINY if check.args.dry_run else QWEN_7B
    begin = time.perf_counter()
    directory = check.build("qwen2.5-7b", sizes)
    result: dict = {"build_and_save_s": round(time.perf_counter() - begin, 1)}
    begin = time.perf_counter()
    loaded = cdscope.load_model(str(directory), device=check.args.device, dtype="auto")
    result |= {"load_s": round(time.perf_counter() - begin, 1), "dtype": str(loaded.dtype)}
    result["parameters_B"] = round(sum(p.numel() for p in loaded.model.parameters()) / 1e9, 3)
    begin = time.perf_counter()
    arch = architecture_of(loaded.model)
    result |= {
        "K": arch.K,
        "proof": arch.proof.as_dict(),
        "proof_s": round(time.perf_counter() - begin, 1),
    }
    for batch_size in (None, 1):  # the whole probe in one batch; one row per forward on OOM
        try:
            result |= bshared_per_seed(check, loaded, batch_size)
            break
        except torch.OutOfMemoryError as exc:
            result[f"oom_batch_{batch_size or 'all'}"] = one_line(exc)
            reset_peak(check.device)
    timing = precision_gpu.measure_loaded(
        loaded, seeds=1, n=3, reps=check.args.reps, batch_size=batch_size
    )
    shutil.rmtree(directory, ignore_errors=True)  # 15 GiB of the machine's 64
    result |= {
        "C_s": timing["C_s"],
        "forward_s": timing["forward_s"],
        "C_over_forward": timing["C_s"] / timing["forward_s"],
        "C_peak_GiB": timing.get("peak_GiB"),
    }
    return result


def bshared_per_seed(check: Check, loaded, batch_size: int | None) -> dict:  # noqa: ANN001
    """``cdscope.bshared`` seed by seed (seconds each), as ``cdscope bshared --seeds 2``."""
    import cdscope

    values, seconds = [], []
    reset_peak(check.device)
    for seed in range(check.args.seeds):
        sync(check.device)
        begin = time.perf_counter()
        audit = cdscope.bshared(loaded, seeds=[seed], n=3, batch_size=batch_size, progress=False)
        sync(check.device)
        seconds.append(round(time.perf_counter() - begin, 2))
        rows = audit.per_seed.query("measure == 'B_shared_C'")
        values.append(round(100 * float(rows["value"].iloc[0]), 3))
    return {
        "batch_size": batch_size or "whole probe",
        "B_shared_pct": values,
        "seconds_per_seed": seconds,
        "peak_GiB": peak_gib(check.device),
    }


def precision(check: Check) -> dict:
    """float32 vs bfloat16 (sdpa, flash-attn 2) at the 1.5B geometry on the device."""
    directory = check.build("qwen2.5-1.5b", TINY if check.args.dry_run else QWEN_1P5B)
    rows = precision_gpu.compare_kernels(
        str(directory), check.args.kernels, check.args.device, check.args.seeds, 3, check.args.reps
    )
    return {"rows": rows}


def training(check: Check) -> dict:
    """One GRPO step vs one CD-RFT step (float32), checkpointing on/off, bf16 CD-RFT."""
    from cdscope.commands.train import run_train
    from cdscope.settings.training import TrainConfig

    directory = check.build("qwen2.5-1.5b", TINY if check.args.dry_run else QWEN_1P5B)
    geometry = (
        dict(prompts_per_step=2, group_size=2, max_new_tokens=8, probe_n=1)
        if check.args.dry_run
        else dict(prompts_per_step=8, group_size=4, max_new_tokens=64, probe_n=3)
    )
    runs = {
        "grpo": dict(regularizer="none"),
        "cdrft": dict(regularizer="cdrft"),
        "cdrft_checkpointing": dict(regularizer="cdrft", activation_checkpointing=True),
        "cdrft_bfloat16": dict(regularizer="cdrft", dtype="bfloat16"),
    }
    result: dict = {"geometry": geometry, "reward": "sha256(completion)[0] % 2 (half pass)"}
    for name, changes in runs.items():
        if name not in check.args.train_runs:
            continue
        cfg = TrainConfig(
            model=str(directory), out_dir=str(check.tmp / f"train_{name}"), device=check.args.device,
            steps=check.args.train_steps, save_every=10**6, k_max=1, lr=1e-6,
            **geometry, **{"dtype": "float32", **changes},
        )  # fmt: skip
        reset_peak(check.device)
        from rich.console import Console

        try:
            log = run_train(cfg, console=Console(file=check.log), reward_fn=hashed_reward).log
        except Exception as exc:  # noqa: BLE001 - recorded per run
            traceback.print_exc(file=check.log)
            result[name] = {"error": one_line(exc)}
            continue
        finally:
            shutil.rmtree(cfg.out_dir, ignore_errors=True)  # ~18 GiB a run: the disk is 64 GiB
        last = log.iloc[-1]
        parts = ["rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s"]
        result[name] = {
            "steps_logged": len(log),
            **{p: round(float(last[p]), 3) for p in parts if p in log},
            "proj_iters": int(last.get("proj_iters", 0)),
            "peak_GiB": peak_gib(check.device),
        }
    grpo, cd = result.get("grpo", {}), result.get("cdrft", {})
    if "step_s" in grpo and "step_s" in cd:
        result["cdrft_overhead_pct"] = round(
            100 * (cd["step_s"] - grpo["step_s"]) / grpo["step_s"], 1
        )
        extra = cd.get("regularizer_s", 0) + cd.get("projection_s", 0)
        result["cdrft_same_step_overhead_pct"] = round(100 * extra / (cd["step_s"] - extra), 1)
    return result


def generation(check: Check) -> dict:
    """``cdscope eval``'s hf backend on the math eval set: generated tokens per second."""
    from cdscope.commands.evaluate import evaluate
    from cdscope.commands.requests import EvalRequest
    from cdscope.core.models.opening import ModelOptions
    from cdscope.settings.evaluation import EvalSettings
    from cdscope.tasks import default_task_paths, load_tasks

    directory = check.build("qwen2.5-1.5b", TINY if check.args.dry_run else QWEN_1P5B)
    math = [p for p in default_task_paths("eval") if p.stem == "math"]
    n, limit, tokens = (2, 1, 8) if check.args.dry_run else (16, 2, 128)
    settings = EvalSettings(
        n=n, ks=(1,), limit=limit, batch_size=n * limit, max_new_tokens={"*": tokens}
    )
    request = EvalRequest(
        [str(directory)], load_tasks(math), settings, check.tmp / "eval",
        ModelOptions(check.args.device, "bfloat16"),
    )  # fmt: skip
    from rich.console import Console

    stats = evaluate(request, console=Console(file=check.log)).stats.iloc[0]
    return {
        "problems": int(stats["problems"]),  # --limit per benchmark of the math set
        "n": n,
        "max_new_tokens": tokens,
        "tokens": int(stats["tokens"]),
        "generate_s": round(float(stats["generate_s"]), 2),
        "tokens_per_s": round(float(stats["tokens_per_s"]), 1),
    }


def markdown(results: dict) -> str:
    """The short table: one line per section, its key figures or its error."""
    env = results["environment"]
    lines = [
        f"gpu_check on {env.get('gpu', env['device'])} (torch {env['torch']}, transformers "
        f"{env['transformers']}, cdscope {env['cdscope']}){' DRY RUN' if env['dry_run'] else ''}",
        "",
        "| section | result |",
        "|---|---|",
    ]
    for name, got in results["sections"].items():
        if "error" in got or "skipped" in got:
            lines.append(f"| {name} | {got.get('error') or 'skipped: ' + got['skipped']} |")
            continue
        lines.append(f"| {name} | {summary(name, got)} ({got['seconds']} s) |")
    return "\n".join(lines) + "\n"


def summary(name: str, got: dict) -> str:
    if name == "headline":
        return (
            f"K {got['K']}, {got['dtype']}, proof ok; B_shared {got.get('B_shared_pct')} %; "
            f"{got.get('seconds_per_seed')} s/seed; C / forward {got['C_over_forward']:.2f}; "
            f"peak {fmt(got.get('peak_GiB'))} GiB"
        )
    if name == "precision":
        parts = []
        for row in got["rows"]:
            if "refused" in row:
                parts.append(f"{row['kernel']}: refused ({row['refused'][:80]})")
            else:
                diff = row.get("B_shared_vs_fp32_points")
                cos = row.get("C_cosine_vs_fp32")
                parts.append(
                    f"{row['kernel']}: B {[round(100 * b, 2) for b in row['B_shared']]}"
                    + (f", vs fp32 {[round(d, 2) for d in diff]} pt, cos {cos:.4f}" if diff else "")
                )
        return "; ".join(parts)
    if name == "training":
        runs = [
            f"{k}: {v.get('error') or str(v.get('step_s')) + ' s/step, peak ' + fmt(v.get('peak_GiB')) + ' GiB'}"
            for k, v in got.items()
            if isinstance(v, dict) and k != "geometry"
        ]
        return f"overhead {got.get('cdrft_overhead_pct')} %; " + "; ".join(runs)
    return f"{got['tokens_per_s']} tokens/s ({got['tokens']} tokens, n {got['n']})"


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


#: what the device tool carries at most: the working tree plus the carried paths
TRAVEL_LIMIT = 64 * 2**20


def travel_size(root: Path, carried: tuple[str, ...] = (".whl",)) -> int:
    """Bytes the device tool sends: tracked and untracked-not-ignored files, plus
    ``carried`` folders (the working tree's limit counts both)."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    files = [root / name for name in listed if name]
    files += [f for c in carried for f in (root / c).rglob("*")]
    return sum(f.stat().st_size for f in files if f.is_file())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON; the Markdown table goes beside it")
    parser.add_argument(
        "--travel-size", action="store_true",
        help="print what the device tool would carry (working tree + .whl) and exit 1 over 64 MiB",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="tiny configs on the CPU")
    parser.add_argument("--device", default=None, help="default: cuda, cpu with --dry-run")
    parser.add_argument("--tokenizer", help="a tokenizer folder (make gpu-wheels: .whl/tokenizer)")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=2, help="the last step is reported")
    parser.add_argument(
        "--train-runs", nargs="*", default=list(TRAIN_RUNS), choices=TRAIN_RUNS,
        help="which training runs (training)",
    )  # fmt: skip
    parser.add_argument("--kernels", nargs="*", default=None, help="dtype:attn (precision)")
    parser.add_argument("--budget-s", type=float, default=480, help="skip sections past this")
    parser.add_argument("--log", help="the training/eval consoles and tracebacks go here")
    args = parser.parse_args(argv)
    if not args.travel_size and not args.out:
        parser.error("--out is required")
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    if args.kernels is None:
        args.kernels = (
            ["float32:sdpa", "bfloat16:sdpa"] if args.dry_run else list(precision_gpu.KERNELS)
        )
    if args.dry_run:
        args.reps, args.budget_s = 1, min(args.budget_s, 300)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.travel_size:
        size = travel_size(Path(__file__).resolve().parents[1])
        print(
            f"the device tool would carry {size / 2**20:.1f} MiB (limit {TRAVEL_LIMIT / 2**20:.0f})"
        )
        if size > TRAVEL_LIMIT:
            raise SystemExit(1)
        return {"travel_bytes": size}
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the loading / saving bars would bury the figures
    check = Check(args)
    with contextlib.closing(check.log):
        check.section("headline", lambda: headline(check), needs_s=60)
        check.section("training", lambda: training(check), needs_s=60)
        check.section("precision", lambda: precision(check), needs_s=30)
        check.section("generation", lambda: generation(check), needs_s=20)
        check.write()
    print(Path(args.out).with_suffix(".md").read_text(), flush=True)
    return check.results


if __name__ == "__main__":
    main()
