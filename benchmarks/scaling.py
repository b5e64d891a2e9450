"""Measured scaling of C estimation and the proxy regulariser gradient (issue 16, part 4).

Times and peak memory of three operations, against model size and probe tokens:

- forward: one no-grad forward with full logits over the padded batch (the unit
  ``bench_control.py`` compares C with);
- control: ``control_autograd`` (C, F, l_m: one gated forward + one gate backward);
- proxy:   ``regularizer_grad(estimator="proxy", eps=0.05)``, the SPEC reference step,
  standalone (its own C pass, 2 perturbed forward + parameter backward, 1 nominal).

Every operation runs the whole batch in one forward (``batch_size=None``, the GPU
default; the CPU CLI default is one row per forward), fp32, sdpa attention, on a
synthetic probe: ``rows`` sequences of ``T`` random token ids, 3 families dealt
round-robin, the last 37 % of each row scored (the shipped pools average 61 of 166
tokens scored). Models: the embedded SmolLM2-135M (its real weights) and random-init
models built from local transformers configs (no download): SmolLM2-360M and -1.7B
shapes (Llama) and the Qwen2.5-1.5B shape.

Each configuration runs in a fresh subprocess, one torch thread by default. Round 0
warms up and measures memory: before each operation glibc hands freed heap back
(``malloc_trim(0)``) and the RSS high-water mark is reset (``echo 5 >
/proc/self/clear_refs``); VmHWM from /proc/self/status after the operation is its peak
RSS: everything the process holds (libraries, weights, activations, gradients). Then
``--reps`` timed rounds, interleaved (forward, control, proxy, forward, ...; the proxy in
the first ``--proxy-reps`` rounds only), no trimming. Time is the process CPU time
(``time.process_time``; with one thread, the compute, robust to other processes sharing
the cores); wall times are recorded beside it. Reported: medians.

    OMP_NUM_THREADS=1 python benchmarks/scaling.py --sweep size --out /tmp/scaling.json
    OMP_NUM_THREADS=1 python benchmarks/scaling.py --sweep tokens --proxy-reps 1 \
        --out /tmp/scaling.json --append --plot docs/img/scaling.png
    python benchmarks/scaling.py --from-json /tmp/scaling.json --plot docs/img/scaling.png
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCORED_FRACTION = 0.37
FAMILIES = 3
PROXY_EPS = 0.05  # SPEC §5 reference step
#: random-init shapes (transformers config kwargs); the embedded model is "smollm2-135m"
SHAPES: dict[str, tuple[str, dict]] = {
    "smollm2-360m": ("llama", dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15,
                                   num_key_value_heads=5, intermediate_size=2560,
                                   vocab_size=49152, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                   num_key_value_heads=2, intermediate_size=8960,
                                   vocab_size=151936, tie_word_embeddings=True)),
    "smollm2-1.7b": ("llama", dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
                                   num_key_value_heads=32, intermediate_size=8192,
                                   vocab_size=49152, tie_word_embeddings=True)),
}  # fmt: skip
ALL_OPS = ("forward", "control", "proxy")
#: (model, rows, T, ops); fp32 proxy needs ~3x the weights (weights + gradient
#: accumulator + one backward's gradients): 1.5B/1.7B would need ~20 GB, more than this
#: shared 23 GB machine can give, and bf16 is refused by the proxy's precision guard.
FC = ("forward", "control")
#: (model, [(rows, T, ops), ...]): one process per model
SIZE_SWEEP = [
    ("smollm2-135m", [(3, 32, ALL_OPS)]),
    ("smollm2-360m", [(3, 32, ALL_OPS)]),
    ("qwen2.5-1.5b", [(3, 32, FC)]),
    ("smollm2-1.7b", [(3, 32, FC)]),
]
#: on the 135M, with its 3 x 32 point above: T (32 -> 128) and rows (3 -> 9) varied apart
TOKEN_SWEEP = [("smollm2-135m", [(3, 64, ALL_OPS), (3, 128, FC), (9, 32, FC)])]


# -- worker (one configuration, in its own process) ----------------------------------
def _proc_status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> int:
    """Return freed heap to the OS, reset VmHWM to the current RSS; returns that RSS (bytes)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _proc_status_kb("VmRSS") * 1024


def build_model(name: str):  # noqa: ANN201
    """The embedded 135M (real weights) or a random-init fp32 model of a SHAPES config."""
    import torch

    if name == "smollm2-135m":
        from cdscope.core.models import load_model

        return load_model(attn="sdpa", dtype="float32").model
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = SHAPES[name]
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


def synthetic_batch(rows: int, T: int, vocab: int, seed: int = 0):  # noqa: ANN201, N803
    """``rows`` x ``T`` random ids, FAMILIES families round-robin, last 37 % scored."""
    import torch

    from cdscope.core.batch import ProbeBatch

    generator = torch.Generator().manual_seed(seed)
    families = [f"f{m}" for m in range(min(FAMILIES, rows))]
    order = sorted(range(rows), key=lambda b: b % len(families))  # rows grouped by family
    return ProbeBatch(
        input_ids=torch.randint(3, vocab, (rows, T), generator=generator),
        lengths=torch.full((rows,), T),
        target_start=torch.full((rows,), T - max(1, round(SCORED_FRACTION * T))),
        families=families,
        row_family=torch.tensor([b % len(families) for b in order]),
        item_ids=[f"synthetic-{b}" for b in order],
    )


def _measure(ops: dict, names: list[str], reps: int, proxy_reps: int) -> dict:
    """Round 0 (warm-up, peak RSS of each op), then ``reps`` interleaved timed rounds."""
    wall: dict[str, list[float]] = {op: [] for op in names}
    cpu: dict[str, list[float]] = {op: [] for op in names}
    memory: dict[str, tuple[int, int, float]] = {}
    for op in names:  # round 0: freed heap returned and the high-water mark reset first
        rss = _reset_peak()
        c0 = time.process_time()
        ops[op]()
        memory[op] = (rss, _proc_status_kb("VmHWM") * 1024, time.process_time() - c0)
    for rep in range(reps):  # timed rounds, interleaved, no trimming
        for op in names:
            if op == "proxy" and rep >= proxy_reps:
                continue
            w0, c0 = time.perf_counter(), time.process_time()
            ops[op]()
            cpu[op].append(time.process_time() - c0)
            wall[op].append(time.perf_counter() - w0)
    return {
        op: {
            "median_s": statistics.median(cpu[op]),
            "cpu_s": cpu[op],
            "wall_s": wall[op],
            "warmup_cpu_s": memory[op][2],
            "rss_before": memory[op][0],
            "peak_rss": memory[op][1],
        }
        for op in names
    }


def run_worker(spec: dict) -> list[dict]:
    """Build ``spec["model"]`` once, measure each geometry ``[rows, T, ops]`` on it."""
    import torch

    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.regularizer import regularizer_grad

    torch.set_num_threads(spec["threads"])
    geometries = spec.get("geometries") or [[spec["rows"], spec["T"], spec["ops"]]]
    rss_libs = _reset_peak()
    start = time.perf_counter()
    model = build_model(spec["model"])
    build_s = time.perf_counter() - start
    rss_model = _reset_peak()
    config = model.config
    common = {
        "model": spec["model"],
        "params": sum(p.numel() for p in model.parameters()),
        **{k: spec[k] for k in ("reps", "proxy_reps", "threads")},
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "vocab": config.vocab_size,
        "build_s": build_s,
        "rss_libs": rss_libs,
        "rss_model": rss_model,
    }
    out = []
    start = time.perf_counter()
    with GatedModel(model) as gm:
        common["proof_s"] = time.perf_counter() - start
        common["K"] = gm.gate_set.K
        common["rss_ready"] = _reset_peak()
        for rows, T, names in geometries:  # noqa: N806
            batch = synthetic_batch(rows, T, config.vocab_size)

            @torch.no_grad()
            def forward(batch=batch) -> None:  # noqa: ANN001
                model(input_ids=batch.input_ids, use_cache=False)

            ops = {
                "forward": forward,
                "control": lambda batch=batch: control_autograd(gm, batch),
                "proxy": lambda batch=batch: regularizer_grad(gm, batch, "proxy", PROXY_EPS),
            }
            measured = _measure(ops, list(names), spec["reps"], spec["proxy_reps"])
            out.append({**common, "rows": rows, "T": T, "tokens": rows * T, "ops": measured})
    return out


# -- driver ------------------------------------------------------------------------
def run_config(spec: dict, timeout: float) -> list[dict]:
    """One worker process (fresh RSS, one model) for ``spec``; its results."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(spec["threads"]),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                       os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        check=True, capture_output=True, text=True, env=env, timeout=timeout,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sweep", choices=("size", "tokens", "all"), default="all")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--proxy-reps", type=int, default=2, help="timed rounds of the proxy")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    parser.add_argument("--out", type=Path, help="write the raw results (JSON) here")
    parser.add_argument("--append", action="store_true", help="add to the results in --out")
    parser.add_argument("--from-json", type=Path, help="analyse these results; measure nothing")
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        measured = run_worker(spec)
        print(json.dumps(measured if "geometries" in spec else measured[0]))
        return
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        plan = {"size": SIZE_SWEEP, "tokens": TOKEN_SWEEP, "all": SIZE_SWEEP + TOKEN_SWEEP}
        append = args.append and args.out and args.out.exists()
        results = json.loads(args.out.read_text()) if append else []
        for model, geometries in plan[args.sweep]:
            spec = dict(model=model, geometries=geometries, reps=args.reps,
                        proxy_reps=args.proxy_reps, threads=args.threads)  # fmt: skip
            start = time.perf_counter()
            results += run_config(spec, args.timeout)
            print(f"measured {model} in {time.perf_counter() - start:.0f} s wall", flush=True)
            for r in results[-len(geometries) :]:
                print(f"  {r['rows']} x {r['T']}: " + ", ".join(
                    f"{op} {v['median_s']:.2f} cpu s / {v['peak_rss'] / 2**30:.2f} GiB"
                    for op, v in r["ops"].items()), flush=True)  # fmt: skip
            if args.out:  # after every configuration: a killed run keeps what it measured
                args.out.write_text(json.dumps(results, indent=1))
    from scaling_report import report

    report(results, args.plot)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
