"""The lean GRPO step against its plain twin on a GPU (issue 35): exactness and time.

A random model of the embedded model's shape (SmolLM2-135M: Llama, 30 layers, d 576, 9
heads, 3 KV heads, vocabulary 49152) -- or ``--size 1b`` (16 layers, d 2048) -- on CUDA,
sdpa attention, in float32 and bfloat16, at the replication geometry (8 prompts x G = 4,
24 new tokens, temperature 0.6; prompts of 70-110 byte tokens). For each dtype:

* ``prompt_cache_is_exact`` on the device (the check that picks the shared prompt);
* rollouts with per-row and with shared prefill, same seed: the share of identical
  completions and the median time of ``--reps`` runs;
* the backbone gradient, plain and lean, on the same rollouts (rewards fixed so that 3
  of 8 groups have advantage 0): max |g_lean - g_plain| / max |g_plain| and median times.

    python benchmarks/gpu_lean_step.py [--size 135m|1b] [--reps 3] [--json F]

CPU works too (slowly; ``--device cpu``), which is how the script itself is checked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SIZES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from cdscope.core.generation import prompt_cache_is_exact, sample
    from cdscope.tools.tiny import byte_tokenizer
    from cdscope.train.grpo import backbone_backward, group_advantages

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", choices=sorted(SIZES), default="135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    device = torch.device(args.device)
    tokenizer = byte_tokenizer()
    words = [
        "the",
        "of",
        "a",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
    ]
    rng = __import__("random").Random(0)
    prompts = []
    for _ in range(8):
        text = ""
        while len(text) < rng.randint(70, 110):
            text += rng.choice(words) + " "
        prompts.append(text + "=")
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0,
                            1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0])  # fmt: skip
    report: dict = {"size": args.size, "device": str(device)}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        sync()
        began = time.perf_counter()
        out = fn(*a, **kw)
        sync()
        return out, time.perf_counter() - began

    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048,
                             attn_implementation="sdpa", **SIZES[args.size])  # fmt: skip
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
        params = [q for q in model.parameters() if q.requires_grad]
        row: dict = {"dtype": name, "cache_exact": prompt_cache_is_exact(model, device)}
        times: dict[str, list[float]] = {}
        rollouts = {}
        for rep in range(args.reps + 1):  # the first of each: warm-up, not timed
            for shared in (True, False) if rep % 2 else (False, True):
                r, seconds = timed(sample, model, tokenizer, prompts, num_samples=4,
                                   max_new_tokens=24, temperature=0.6, seed=rep,
                                   share_prefill=shared)  # fmt: skip
                if rep:
                    times.setdefault(f"rollout_{'lean' if shared else 'plain'}_s", []).append(
                        seconds
                    )
                rollouts[shared, rep] = r
        same = [
            torch.equal(a, b)
            for rep in range(args.reps + 1)
            for a, b in zip(rollouts[True, rep].completion_ids, rollouts[False, rep].completion_ids, strict=True)
        ]  # fmt: skip
        row["same_completions"] = sum(same) / len(same)
        r = rollouts[False, 0]
        advantages = group_advantages(rewards, 4)
        grads = {}
        for rep in range(args.reps + 1):
            for plain in (True, False) if rep % 2 else (False, True):
                model.zero_grad(set_to_none=True)
                stats, seconds = timed(backbone_backward, model, r.prompt_ids, r.prompt_mask,
                                       r.completion_ids, r.completion_mask, advantages,
                                       micro_batch_size=8, plain=plain)  # fmt: skip
                if rep:
                    times.setdefault(f"backbone_{'plain' if plain else 'lean'}_s", []).append(
                        seconds
                    )
                grads[plain] = torch.cat([q.grad.float().flatten() for q in params])
                row.setdefault("path", stats.path) if not plain else None
                row["skipped_fraction"] = (
                    stats.skipped_fraction if not plain else row.get("skipped_fraction")
                )
        row["grad_max_rel_diff"] = float(
            (grads[False] - grads[True]).abs().max() / grads[True].abs().max()
        )
        row.update({k: statistics.median(v) for k, v in times.items()})
        row["rollout_ratio"] = row["rollout_lean_s"] / row["rollout_plain_s"]
        row["backbone_ratio"] = row["backbone_lean_s"] / row["backbone_plain_s"]
        row["step_ratio"] = (row["rollout_lean_s"] + row["backbone_lean_s"]) / (
            row["rollout_plain_s"] + row["backbone_plain_s"]
        )
        print(json.dumps(row), flush=True)
        report[name] = row
        del model
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
