"""Peak memory of one CD-RFT step with and without activation checkpointing and FSDP2 (issue 27).

Four engines: plain, ``--activation-checkpointing``, ``--sharding fsdp`` (2 ranks) and
both. Each runs in fresh processes (FSDP: ``torchrun --nproc_per_node 2``, gloo on CPU),
on a random-init Llama built from a local config (no download) whose activations are not
negligible next to its weights, and measures the phases of a CD-RFT step (SPEC §5) one at
a time, each on the same synthetic data:

- ``C``: ``control_autograd`` (gated forward + gate backward, the probe measurement);
- ``regulariser``: the default ``folded`` regulariser gradient (2 gated forwards + parameter
  backwards, the measurement handed over);
- ``GRPO backward``: ``backbone_backward`` over the step's completions, in micro-batches;
- ``AdamW step``: the optimizer step (its state is created here, at the first step);
- ``step``: all four in sequence, as the hf loop runs them.

The probe goes through in one batch (``batch_size=None``, the GPU default), as do the
micro-batches of completions. Peak memory is the process's peak RSS (VmHWM from
/proc/self/status, reset before each phase with ``malloc_trim(0)`` and ``echo 5 >
/proc/self/clear_refs``: ``benchmarks/scaling.py``'s method); "extra" is that peak minus
the RSS just before the phase, i.e. what the phase adds on top of the weights (and of
gradients / optimizer state held from before). Under FSDP each rank is a process: its
numbers are per rank, and ranks agree to a few MB.

    OMP_NUM_THREADS=1 python benchmarks/bench_memory.py                  # all four, table
    OMP_NUM_THREADS=1 python benchmarks/bench_memory.py --layers 4 --tokens 128   # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import scaling  # noqa: E402  (its peak-RSS helpers and synthetic probe)

ENGINES = {
    "plain": (False, 1),
    "checkpointing": (True, 1),
    "fsdp x2": (False, 2),
    "fsdp x2 + checkpointing": (True, 2),
}
PHASES = ("C", "regulariser", "GRPO backward", "AdamW step", "step")
MB = 1e6


def build(spec: dict):  # noqa: ANN201
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=spec["hidden"], intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"], num_attention_heads=8, num_key_value_heads=8,
        vocab_size=spec["vocab"], max_position_embeddings=4096, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def rollouts(spec: dict):  # noqa: ANN201
    """Synthetic completions: ``completions`` rows of a 32-token prompt + ``tokens`` new."""
    import torch

    g = torch.Generator().manual_seed(1)
    n, prompt, new = spec["completions"], 32, spec["tokens"]
    advantages = torch.randn(n, generator=g)
    ids = torch.randint(3, spec["vocab"], (n, prompt + new), generator=g)
    ones = torch.ones(n, prompt, dtype=torch.bool)
    return ids[:, :prompt], ones, ids[:, prompt:], torch.ones(n, new, dtype=torch.bool), advantages


def worker(spec: dict) -> dict:
    """One process (one rank): build, apply the engines, measure each phase."""
    import torch

    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models.architecture import architecture_of
    from cdscope.core.regularizer import regularizer_grad
    from cdscope.train.engine import checkpoint_blocks, shard, shards_of
    from cdscope.train.grpo import backbone_backward

    torch.set_num_threads(1)
    model = build(spec)
    out: dict = {"params": sum(p.numel() for p in model.parameters())}
    architecture_of(model)
    if spec["checkpointing"]:
        checkpoint_blocks(model)
    if spec["world"] > 1:
        shard(model)
    params = [p for p in model.parameters() if p.requires_grad]
    shards = shards_of(params)
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    batch = scaling.synthetic_batch(spec["rows"], spec["probe_T"], spec["vocab"])
    p_ids, p_mask, c_ids, c_mask, adv = rollouts(spec)

    with GatedModel(model) as gm:
        control_autograd(gm, batch)  # warm-up: allocator pools, FSDP lazy init

        def measure_c():  # noqa: ANN202
            return control_autograd(gm, batch)

        nominal = measure_c()

        def regulariser() -> None:
            regularizer_grad(gm, batch, "folded", 0.01, params, nominal=nominal)

        def grpo() -> None:
            optimizer.zero_grad(set_to_none=True)
            backbone_backward(
                model, p_ids, p_mask, c_ids, c_mask, adv,
                micro_batch_size=spec["micro_batch"],
                share=shards.share(len(adv)), scale=float(shards.world),
            )  # fmt: skip

        def step() -> None:
            grpo()
            control = measure_c()
            result = regularizer_grad(gm, batch, "folded", 0.01, params, nominal=control)
            with torch.no_grad():
                for p, g in zip(params, result.grads, strict=True):
                    p.grad.add_(g)
            optimizer.step()

        for name, phase in (
            ("C", measure_c), ("regulariser", regulariser), ("GRPO backward", grpo),
            ("AdamW step", optimizer.step), ("step", step),
        ):  # fmt: skip
            before = scaling._reset_peak()
            began = time.process_time()
            phase()
            peak = scaling._proc_status_kb("VmHWM") * 1024
            out[name] = {"extra": peak - before, "peak": peak, "cpu_s": time.process_time() - began}
    return out


def run(engine: str, spec: dict, timeout: float) -> list[dict]:
    checkpointing, world = ENGINES[engine]
    spec = {**spec, "checkpointing": checkpointing, "world": world}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        args = [__file__, "--worker", json.dumps(spec), "--out", tmp]
        if world == 1:
            cmd = [sys.executable, *args]
        else:
            torchrun = str(Path(sys.executable).with_name("torchrun"))
            cmd = [torchrun, "--standalone", f"--nproc_per_node={world}", *args]
        subprocess.run(cmd, check=True, env=env, timeout=timeout, capture_output=True)
        return [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]


# -- what fits on 80 GB GPUs: arithmetic from docs/scaling.md's measured laws ------------
#: C's activation bytes per token (fp32) = BETA_H * L * h + BETA_I * L * i; a parameter
#: backward (the proxy) holds RHO times C's (docs/scaling.md, "Fitted laws")
BETA_H, BETA_I, RHO = 68.2, 12.7, 1.28
#: params, layers, hidden, intermediate, vocab, kv width (kv heads x head dim); untied heads
TRAIN_TARGETS = {
    "Qwen2.5-7B": (7.6e9, 28, 3584, 18944, 152064, 512),
    "Llama-3-70B": (70.6e9, 80, 8192, 28672, 128256, 1024),
}
PROBE_TOKENS = 9 * 300  # the reference probe in one padded batch (docs/scaling.md)
PROMPT, NEW, COMPLETIONS = 200, 512, 32  # SPEC §5: 8 prompts x 4, 512 new tokens


#: with checkpointing, what the backward holds besides the saved block inputs, in blocks'
#: worth: measured on this script's default model (8 x 512, 1728 probe tokens), C held
#: 194 kB/token = 16.4 kB of inputs + 3.27 x its per-layer 54.4 kB, the folded
#: regulariser 179 kB/token = 16.4 + 2.33 x 69.6 kB (a block recomputed, its backward's
#: buffers, the head); the larger is used
KAPPA = 3.3


def activation_bytes_per_token(L: int, h: int, i: int, checkpointing: bool) -> float:  # noqa: N803
    """A parameter backward's activations per token, fp32: all L blocks' (RHO x C's law),
    or with checkpointing the L saved block inputs (4 h bytes each) plus KAPPA blocks'."""
    one_block = RHO * (BETA_H * h + BETA_I * i)
    return 4.0 * L * h + KAPPA * one_block if checkpointing else L * one_block


def per_gpu(name: str, gpus: int, ckpt: bool, micro_batch: int) -> dict[str, float]:
    """Per-GPU bytes of one fp32 CD-RFT step of TRAIN_TARGETS[name] under FSDP2 on ``gpus``."""
    from scaling_report import GPU_BYTES, USABLE

    P, L, h, i, vocab, kv = TRAIN_TARGETS[name]  # noqa: N806
    root = 2 * vocab * h  # embedding + untied head: the root FSDP group
    block = (P - root) / L
    state = 16 * P / gpus  # fp32 weights + gradients + AdamW m and v, sharded
    # unsharded working set: the root group and two blocks (the next one prefetched),
    # parameters and their gradients before the reduce-scatter
    working = 0.0 if gpus == 1 else 2 * 4 * root + 2 * 2 * 4 * block
    act = activation_bytes_per_token(L, h, i, ckpt)
    logits = 3 * 4 * micro_batch * (NEW + 1) * vocab  # fp32 logits, log-softmax, gradient
    kv_cache = COMPLETIONS * (PROMPT + NEW) * L * 2 * kv * 4
    gathered = 4 * P if gpus > 1 and 4 * P <= USABLE * GPU_BYTES / 2 else 0.0
    parts = {
        "state": state,
        "working": working,
        "probe": act * PROBE_TOKENS,
        "grpo": act * micro_batch * (PROMPT + NEW) + logits,
        "rollout": (gathered or working) + kv_cache,
    }
    parts["peak"] = state + max(working + parts["probe"], working + parts["grpo"], parts["rollout"])
    return parts


def training_fits(micro_batch: int = 8) -> list[str]:
    """Markdown rows: per-GPU memory of one CD-RFT step in fp32 (weights, gradients, AdamW),
    then the fewest 80 GB GPUs each model needs with checkpointing."""
    from scaling_report import GB, GPU_BYTES, USABLE

    rows = [
        "| model | 80 GB GPUs | checkpointing | sharded state | gathered working set | "
        "probe activations | GRPO micro-batch | rollouts | peak per GPU (GB) | fits 72 GB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in TRAIN_TARGETS:
        for gpus in (1, 8):
            for ckpt in (False, True):
                c = {k: v / GB for k, v in per_gpu(name, gpus, ckpt, micro_batch).items()}
                rows.append(
                    f"| {name} | {gpus} | {'yes' if ckpt else 'no'} | {c['state']:.1f} | "
                    f"{c['working']:.1f} | {c['probe']:.1f} | {c['grpo']:.1f} | "
                    f"{c['rollout']:.1f} | **{c['peak']:.1f}** | "
                    f"{'yes' if c['peak'] <= USABLE * GPU_BYTES / GB else 'no'} |"
                )
    rows.append("")
    for name in TRAIN_TARGETS:
        for micro in sorted({micro_batch, 1}, reverse=True):
            need = next(
                (g for g in range(1, 4097)
                 if per_gpu(name, g, True, micro)["peak"] <= USABLE * GPU_BYTES),
                None,
            )  # fmt: skip
            if need is None:
                rows.append(
                    f"- {name}, checkpointing, micro-batch {micro}: no GPU count fits (the "
                    "unsharded working set and the activations alone exceed 72 GB)"
                )
                continue
            rows.append(
                f"- {name}, checkpointing, micro-batch {micro}: at least {need} x 80 GB GPUs "
                f"({per_gpu(name, need, True, micro)['peak'] / GB:.1f} GB each)"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=9, help="probe rows (3 families x 3)")
    parser.add_argument("--probe-T", type=int, default=192, help="tokens per probe row")
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=192, help="new tokens per completion")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--fits", action="store_true", help="print the 80 GB table; run nothing")
    parser.add_argument("--from-json", type=Path, help="print the table of saved --json results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fits:
        print("\n".join(training_fits(args.micro_batch)))
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        report(saved["spec"], saved["results"])
        return
    if args.worker:
        rank = os.environ.get("RANK", "0")
        if "RANK" in os.environ:
            import torch.distributed as dist

            dist.init_process_group("gloo")
        result = worker(json.loads(args.worker))
        Path(args.out, f"rank-{rank}.json").write_text(json.dumps(result))
        if "RANK" in os.environ:
            dist.destroy_process_group()
        return
    spec = {k: getattr(args, k) for k in (
        "layers", "hidden", "intermediate", "vocab", "rows", "probe_T", "completions",
        "tokens", "micro_batch",
    )}  # fmt: skip
    results = {}
    for engine in args.engines.split(","):
        began = time.perf_counter()
        results[engine] = run(engine, spec, args.timeout)
        print(f"measured {engine} in {time.perf_counter() - began:.0f} s wall", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"spec": spec, "results": results}, indent=1))
    report(spec, results)


def report(spec: dict, results: dict) -> None:
    """The table: each phase's peak RSS extra (MB; under FSDP the larger of the two ranks),
    its ratio to the plain engine, and what the process held before the step (weights,
    gradients, AdamW state, libraries)."""
    params = results[next(iter(results))][0]["params"]
    print(
        f"\nLlama {spec['layers']} layers, hidden {spec['hidden']}, intermediate "
        f"{spec['intermediate']}, vocab {spec['vocab']}: {params / 1e6:.1f}M params "
        f"({4 * params / MB:.0f} MB fp32); probe {spec['rows']} x {spec['probe_T']} tokens; "
        f"{spec['completions']} completions x {spec['tokens']} new tokens, micro-batch "
        f"{spec['micro_batch']}. Peak RSS extra per phase, MB (FSDP: the larger rank)"
    )
    print(f"{'engine':<26}" + "".join(f"{p:>16}" for p in PHASES) + f"{'held before':>13}")
    plain = results.get("plain")
    for engine, ranks in results.items():
        cells = ""
        for phase in PHASES:
            extra = max(r[phase]["extra"] for r in ranks)
            ratio = ""
            if plain is not None and engine != "plain":
                ratio = f" ({extra / max(r[phase]['extra'] for r in plain):.2f}x)"
            cells += f"{f'{extra / MB:.0f}{ratio}':>16}"
        held = max(r["step"]["peak"] - r["step"]["extra"] for r in ranks)
        print(f"{engine:<26}{cells}{held / MB:>13.0f}")


if __name__ == "__main__":
    main()
