"""The eval engines compared: ``--backend hf`` (transformers) vs ``--backend vllm`` (vLLM
in this process) on the embedded model in float32, the same problems, n and seeds
(issue 37). Run from .venv-vllm (both engines importable), once, on a machine as quiet
as it gets; the load average is printed before and after.

1. Throughput, at 1 and 2 threads (one child process each: vLLM binds its threads at
   start): the first ``--problems`` problems of the shipped eval sets (round robin over
   benchmarks), n = ``--n``, ``--new-tokens`` each; generated tokens / generate seconds
   (EOS counted, as ``cdscope eval`` counts them). Goal: vllm >= 3x hf.
2. Agreement (``--agree-threads``, default 1) at temperature 0.6, n = ``--agree-n`` (16), ``--agree-limit`` problems
   per benchmark: pass@1 and pass@n of each engine over the same problems, verified by
   cdscope's verifiers, with Wilson 95 % intervals over the samples for pass@1; they
   agree when the intervals overlap.
3. Greedy (temperature 0), ``--greedy-limit`` problems per benchmark, n = 1: the share
   of problems whose completions are identical (goal >= 90 %).

    .venv-vllm/bin/python benchmarks/bench_generation.py --backends [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def problems(limit: int) -> list:
    """The first ``limit`` problems of each shipped eval benchmark, in file order."""
    from cdscope.tasks import default_task_paths, load_tasks
    from cdscope.tasks.evaluation import select

    return [task for task, _ in select(load_tasks(default_task_paths("eval")), limit)]


def round_robin(count: int) -> list:
    """``count`` problems, one benchmark after the other (varied prompt lengths)."""
    from cdscope.tasks.io import benchmark_of

    by_bench: dict[str, list] = {}
    for task in problems(count):
        by_bench.setdefault(benchmark_of(task.id, task.family, task.meta), []).append(task)
    out = []
    while len(out) < count and any(by_bench.values()):
        for group in by_bench.values():
            if group and len(out) < count:
                out.append(group.pop(0))
    return out


def engines(temperature: float, per_call: int):  # noqa: ANN201
    """(hf engine, vllm engine) on the embedded model, float32, CPU."""
    from cdscope.core.engines.hf import HFEngine
    from cdscope.core.engines.vllm import VLLMEngine
    from cdscope.core.models import load_model

    loaded = load_model(device="cpu", dtype="float32")
    hf = HFEngine(loaded.model, loaded.tokenizer, temperature, 1.0, None)
    vllm = VLLMEngine(loaded.source, "float32", temperature, 1.0, 0, per_call)
    return hf, vllm


def requests_for(tasks: list, n: int, tokens: int):  # noqa: ANN201
    from cdscope.core.engines import GenRequest
    from cdscope.tasks.evaluation import problem_seed

    return [GenRequest(t.prompt, n, tokens, problem_seed(0, t.id)) for t in tasks]


def timed(engine, requests, per_call: int) -> tuple[list, float]:  # noqa: ANN001
    start = time.perf_counter()
    out = []
    for lo in range(0, len(requests), per_call):
        out += engine.generate(requests[lo : lo + per_call])
    return out, time.perf_counter() - start


def throughput_child(args: argparse.Namespace) -> dict:
    """Phase 1 in this process (its OMP_NUM_THREADS set by the parent)."""
    import torch

    tasks = round_robin(args.problems)
    requests = requests_for(tasks, args.n, args.new_tokens)
    hf, vllm = engines(0.6, len(requests))
    timed(hf, requests[:1], 1), timed(vllm, requests[:2], 2)  # warm-up
    result = {"threads": torch.get_num_threads(), "problems": len(tasks), "n": args.n}
    for name, engine, per_call in (("hf", hf, 1), ("vllm", vllm, len(requests))):
        out, seconds = timed(engine, requests, per_call)
        tokens = sum(g.total_tokens for g in out)
        result[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
    result["ratio"] = result["vllm"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    return result


def wilson(passed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson 95 % interval of a binomial proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = passed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (centre - half, centre + half)


def agreement_child(args: argparse.Namespace) -> dict:
    """Phases 2 and 3 in this process."""
    import numpy as np

    from cdscope.analysis.passk import pass_at_k
    from cdscope.tasks import verify_many

    tasks = problems(args.agree_limit)
    requests = requests_for(tasks, args.agree_n, args.new_tokens)
    hf, vllm = engines(0.6, len(requests))
    sampled = {}
    for name, engine, per_call in (("hf", hf, 1), ("vllm", vllm, len(requests))):
        out, seconds = timed(engine, requests, per_call)
        flat = [(task, text) for task, g in zip(tasks, out, strict=True) for text in g.texts]
        verdicts = verify_many([t for t, _ in flat], [x for _, x in flat], timeout=5.0, workers=2)
        passed = np.array([bool(v.passed) and bool(x.strip())
                           for v, (_, x) in zip(verdicts, flat, strict=True)])  # fmt: skip
        c = passed.reshape(len(tasks), args.agree_n).sum(axis=1)
        n = np.full(len(tasks), args.agree_n)
        at = pass_at_k(n, c, [1, args.agree_n])
        sampled[name] = {
            "passed": int(passed.sum()), "samples": int(passed.size),
            "pass@1": float(at[:, 0].mean()), f"pass@{args.agree_n}": float(at[:, 1].mean()),
            "pass@1_interval": wilson(int(passed.sum()), int(passed.size)),
            "seconds": seconds, "per_problem_c": c.tolist(),
        }  # fmt: skip
    low = max(sampled[k]["pass@1_interval"][0] for k in ("hf", "vllm"))
    high = min(sampled[k]["pass@1_interval"][1] for k in ("hf", "vllm"))
    greedy_tasks = problems(args.greedy_limit)
    greedy = requests_for(greedy_tasks, 1, args.new_tokens)
    hf.temperature = vllm.temperature = 0.0
    a, _ = timed(hf, greedy, 1)
    b, _ = timed(vllm, greedy, len(greedy))
    same = [x.texts == y.texts for x, y in zip(a, b, strict=True)]
    return {
        "agreement": sampled | {"problems": len(tasks), "intervals_overlap": low <= high},
        "greedy": {"problems": len(same), "identical": int(sum(same)),
                   "share": sum(same) / len(same),
                   "differing": [t.id for t, s in zip(greedy_tasks, same, strict=True) if not s]},
    }  # fmt: skip


def child(phase: str, threads: int, args: argparse.Namespace) -> dict:
    """Run ``phase`` in a fresh process with ``threads`` threads; its JSON result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_LOGGING_LEVEL": "ERROR"}
    argv = [sys.executable, __file__, "--child", phase, *sys.argv[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{phase} at {threads} threads failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--agree-n", type=int, default=16)
    parser.add_argument("--agree-limit", type=int, default=1)
    parser.add_argument("--greedy-limit", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="throughput at these thread counts")
    parser.add_argument("--agree-threads", type=int, default=1)
    parser.add_argument("--phases", default="throughput,agreement")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = throughput_child(args) if args.child == "throughput" else agreement_child(args)
        print(json.dumps(result))
        return
    report = {"load_before": load_average(), "cpus": os.cpu_count(), "throughput": []}
    phases = args.phases.split(",")
    for threads in (int(t) for t in args.threads.split(",") if "throughput" in phases):
        row = child("throughput", threads, args)
        report["throughput"].append(row)
        print(f"threads {threads}: hf {row['hf']['tokens_per_s']:.1f} tok/s, vllm "
              f"{row['vllm']['tokens_per_s']:.1f} tok/s, ratio {row['ratio']:.2f} "
              f"(goal >= 3; load {load_average()})", flush=True)  # fmt: skip
    if "agreement" not in phases:
        return
    report |= child("agreement", args.agree_threads, args)
    report["load_after"] = load_average()
    agree, greedy = report["agreement"], report["greedy"]
    for name in ("hf", "vllm"):
        a = agree[name]
        lo, hi = a["pass@1_interval"]
        print(f"T=0.6 n={args.agree_n} {name}: pass@1 {a['pass@1']:.3f} [{lo:.3f}, {hi:.3f}], "
              f"pass@{args.agree_n} {a[f'pass@{args.agree_n}']:.3f} over {agree['problems']} problems")  # fmt: skip
    print(f"pass@1 intervals overlap: {agree['intervals_overlap']}")
    print(f"greedy: {greedy['identical']}/{greedy['problems']} problems identical "
          f"({100 * greedy['share']:.0f} %, goal >= 90 %)")  # fmt: skip
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
