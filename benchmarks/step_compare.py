"""The lean GRPO step against its plain twin, and the CD-RFT step at n = 3 (issue 35).

Run through ``bench_train.py --compare-plain`` (1 thread: ``OMP_NUM_THREADS=1``). On the
embedded model, fp32, at the replication geometry (docs/replication.md: the curriculum
training set, 8 prompts x G = 4, 24 new tokens, temperature 0.6), for each of ``--steps``
batches of the seed's data order, from the same (initial) weights:

* rollouts: ``generation.sample`` with per-row prefill (plain) and with each prompt
  prefilled once for its G rows (lean), same seed; the rows whose completions agree are
  counted;
* rewards: the verifiers, once, on the plain rollouts (the same work in both steps);
* backbone: ``grpo.backbone_backward`` plain and lean on *the same rollouts* (the plain
  ones), from the same weights; ``grad_max_rel_diff`` = max |g_lean - g_plain| / max |g_plain|
  over every parameter entry;
* the AdamW update of the gradient (the same work in both steps).

A step is rollouts + rewards + backbone + update; ``step_ratio`` = median lean step /
median plain step. The order alternates (plain first on even batches, lean first on odd
ones) so drift of a shared machine hits both alike.

Then, at n = 3 on the default probe (the train half of the shipped pools, seed 0): the
probe measurement both arms log (``control_autograd``) and the CD-RFT regulariser
(``--estimator``, the measurement handed over, as in training), and the CD-RFT step
without projection as a multiple of the GRPO step, with and without that measurement in
the GRPO step. ``--probe-max-tokens`` caps the probe's rows as ``cdscope train`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

GOAL_RATIO = 0.5
GOAL_REL_DIFF = 1e-4
GOAL_CDRFT_MULTIPLE = 1.5


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_train.py --compare-plain")
    p.add_argument("--steps", type=int, default=3, help="batches of the data order to time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--probe-n", type=int, default=3)
    p.add_argument("--probe-max-tokens", type=int, default=None)
    p.add_argument("--estimator", default="folded")
    p.add_argument("--eps", type=float, default=0.01)
    p.add_argument("--json", type=Path, help="write step_ratio, grad_max_rel_diff, ... here")
    return p.parse_args(argv)


def timed(fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
    """``(fn(*args, **kwargs), seconds)``."""
    began = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - began


def main(argv: list[str]) -> None:
    import torch

    from cdscope.core.generation import sample
    from cdscope.core.models import load_model
    from cdscope.resources import default_task_dir
    from cdscope.tasks import load_tasks
    from cdscope.train.grpo import backbone_backward, group_advantages
    from cdscope.train.loop import rollout_seed, step_task_indices
    from cdscope.train.run import verifier_rewards

    args = parse(argv)
    json_path = args.json
    loaded = load_model(device="cpu", dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    start_state = [p.detach().clone() for p in params]
    tasks = load_tasks(sorted((default_task_dir() / "curriculum" / "train").glob("*.jsonl")))
    rows = []
    for step in range(args.steps):
        chosen = [
            tasks[i] for i in step_task_indices(len(tasks), args.seed, step, args.prompts_per_step)
        ]
        prompts = [t.prompt for t in chosen]
        seed = rollout_seed(args.seed, step)
        order = (True, False) if step % 2 == 0 else (False, True)
        rollouts, gen_s = {}, {}
        for plain in order:
            rollouts[plain], gen_s[plain] = timed(
                sample, model, tokenizer, prompts, num_samples=args.group_size,
                max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed,
                share_prefill=not plain,
            )  # fmt: skip
        r = rollouts[True]
        same = (rollouts[True].completion_ids.shape == rollouts[False].completion_ids.shape) and [
            torch.equal(a, b)
            for a, b in zip(
                rollouts[True].completion_ids, rollouts[False].completion_ids, strict=True
            )
        ]
        answered = [chosen[int(i)] for i in r.prompt_index]
        scores, reward_s = timed(verifier_rewards, answered, r.texts)
        advantages = group_advantages(torch.tensor(scores), args.group_size)
        grads, bb_s, stats = {}, {}, {}
        for plain in order:
            optimizer.zero_grad(set_to_none=True)
            stats[plain], bb_s[plain] = timed(
                backbone_backward, model, r.prompt_ids, r.prompt_mask, r.completion_ids,
                r.completion_mask, advantages, micro_batch_size=args.micro_batch_size, plain=plain,
            )  # fmt: skip
            grads[plain] = torch.cat([p.grad.flatten() for p in params])
        for p, g in zip(params, torch.split(grads[True], [p.numel() for p in params]), strict=True):
            p.grad = g.view_as(p).clone()
        _, update_s = timed(optimizer.step)
        with torch.no_grad():  # every batch from the same weights
            for p, s in zip(params, start_state, strict=True):
                p.copy_(s)
        optimizer.state.clear()
        diff = float(
            (grads[False] - grads[True]).abs().max() / grads[True].abs().max().clamp_min(1e-30)
        )
        row = {
            "step": step, "prompt_tokens": int(r.prompt_mask[:: args.group_size].sum()),
            "completion_tokens": int(r.completion_mask.sum()),
            "same_completions": (sum(same) / len(same)) if same else 0.0,
            "reward": sum(scores) / len(scores), "skipped_fraction": stats[False].skipped_fraction,
            "lean_path": stats[False].path, "grad_max_rel_diff": diff,
            "rollout_plain_s": gen_s[True], "rollout_lean_s": gen_s[False], "reward_s": reward_s,
            "backbone_plain_s": bb_s[True], "backbone_lean_s": bb_s[False], "update_s": update_s,
        }  # fmt: skip
        row["step_plain_s"] = row["rollout_plain_s"] + reward_s + row["backbone_plain_s"] + update_s
        row["step_lean_s"] = row["rollout_lean_s"] + reward_s + row["backbone_lean_s"] + update_s
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = summarise(rows)
    report["regularizer"] = regulariser_at_n(loaded, args, report)
    report["settings"] = vars(args) | {"json": str(json_path)} | {"threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
                                       "torch_threads": torch.get_num_threads()}  # fmt: skip
    show(report)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {json_path}")


def summarise(rows: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k.endswith("_s")}
    return {
        "step_ratio": med["step_lean_s"] / med["step_plain_s"],
        "grad_max_rel_diff": max(r["grad_max_rel_diff"] for r in rows),
        "rollout_ratio": med["rollout_lean_s"] / med["rollout_plain_s"],
        "backbone_ratio": med["backbone_lean_s"] / med["backbone_plain_s"],
        "medians_s": med,
        "per_step": rows,
        "goals": {
            "step_ratio": GOAL_RATIO,
            "grad_max_rel_diff": GOAL_REL_DIFF,
            "cdrft_multiple": GOAL_CDRFT_MULTIPLE,
        },  # fmt: skip
    }


def regulariser_at_n(loaded, args: argparse.Namespace, report: dict) -> dict:  # noqa: ANN001
    """Probe measurement and regulariser at n = ``args.probe_n`` on the default probe, and
    the CD-RFT step (no projection) as a multiple of the GRPO step."""
    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.probes import load_pool, split_pool
    from cdscope.core.regularizer import regularizer_grad
    from cdscope.train.cdrft import build_probe

    pool = split_pool(load_pool(), "train")
    probe = build_probe(
        pool, loaded.tokenizer, 0, args.probe_n, pool.families, max_tokens=args.probe_max_tokens
    )
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    with GatedModel(loaded.model) as gm:
        nominal, measure_s = timed(control_autograd, gm, probe, 1)
        _, reg_s = timed(
            regularizer_grad, gm, probe, args.estimator, args.eps, params, batch_size=1,
            nominal=nominal,
        )  # fmt: skip
    grpo = report["medians_s"]["step_lean_s"]
    return {
        "probe_tokens": int(probe.lengths.sum()), "probe_rows": probe.B,
        "measure_s": measure_s, "regularizer_s": reg_s, "grpo_step_s": grpo,
        # the hf loop's arms: both measure the probe (the log's B_shared)
        "cdrft_multiple": (grpo + measure_s + reg_s) / (grpo + measure_s),
        # against a GRPO step that measures nothing (the regulariser needs the measurement)
        "cdrft_multiple_vs_bare_grpo": (grpo + measure_s + reg_s) / grpo,
    }  # fmt: skip


def show(report: dict) -> None:
    med, reg = report["medians_s"], report["regularizer"]
    print(
        f"medians over {len(report['per_step'])} batches (s): plain step {med['step_plain_s']:.1f} "
        f"(rollouts {med['rollout_plain_s']:.1f}, backbone {med['backbone_plain_s']:.1f}), "
        f"lean step {med['step_lean_s']:.1f} (rollouts {med['rollout_lean_s']:.1f}, backbone "
        f"{med['backbone_lean_s']:.1f}); rewards {med['reward_s']:.1f}, update {med['update_s']:.1f}"
    )
    print(
        f"step_ratio {report['step_ratio']:.3f} (goal <= {GOAL_RATIO}), grad_max_rel_diff "
        f"{report['grad_max_rel_diff']:.2e} (goal <= {GOAL_REL_DIFF:g})"
    )
    print(
        f"n = {reg['probe_rows'] // 3} probe ({reg['probe_tokens']} tokens): measurement "
        f"{reg['measure_s']:.1f} s, regulariser {reg['regularizer_s']:.1f} s, GRPO step "
        f"{reg['grpo_step_s']:.1f} s -> CD-RFT step = {reg['cdrft_multiple']:.2f}x the GRPO step "
        f"(both measuring the probe), {reg['cdrft_multiple_vs_bare_grpo']:.2f}x a GRPO step that "
        f"measures nothing (goal <= {GOAL_CDRFT_MULTIPLE})"
    )
