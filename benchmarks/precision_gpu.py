"""Issue 24 item 6 on a GPU: the headline measurement in bf16 with sdpa and flash-attn.

For the embedded SmolLM2-135M and a random-init Qwen2 of 1.5B parameters (the sizes of
Qwen2.5-1.5B, built from a config: no download; saved with ``save_pretrained`` in
bfloat16 and loaded by path), in each of float32 + sdpa, bfloat16 + sdpa and bfloat16 +
flash_attention_2 (``pip install 'cdscope[gpu]'``; skipped with its reason when it does
not load): K and the proof's dtype, B_shared(C) per seed and its difference from float32
on the same GPU (points), the worst C-row cosine against float32, the median time of one
C (``control_autograd``, the whole probe in one batch: the GPU default) and of one ungated
forward, and the peak GPU memory of the C measurement (``torch.cuda.max_memory_allocated``).

    python benchmarks/precision_gpu.py --out results/precision_gpu.json   # ~5 min on one GPU
    python benchmarks/precision_gpu.py --device cpu --no-large --kernels float32:sdpa bfloat16:sdpa

docs/precision.md quotes its table (or says that no GPU was at hand).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from cdscope.analysis.spectral import b_shared
from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import architecture_of, load_model
from cdscope.core.probes import draw_probe, load_pool
from cdscope.errors import CdscopeError
from cdscope.tools import tiny

KERNELS = ("float32:sdpa", "bfloat16:sdpa", "bfloat16:flash_attention_2")
#: Qwen2.5-1.5B's sizes (1.54e9 parameters with its 151,936-token vocabulary)
LARGE = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def random_large(directory: Path) -> Path:
    """A random-init 1.5B Qwen2 saved in bfloat16 with the byte tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", **LARGE)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return tiny.save_checkpoint(model, directory, torch.bfloat16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(spec: str, dtype: str, attn: str, device: str, seeds: int, n: int, reps: int) -> dict:
    """K, C per seed, median C and forward times, peak memory of ``spec`` in one kernel."""
    loaded = load_model(spec, device=device, dtype=dtype, attn=attn)
    result = measure_loaded(loaded, seeds, n, reps)
    del loaded
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def measure_loaded(  # noqa: ANN001
    loaded, seeds: int, n: int, reps: int, batch_size: int | None = None
) -> dict:
    """``measure`` on a model already loaded (gpu_check's headline reuses it); C in
    ``batch_size`` rows per forward (None: the whole probe, the GPU default)."""
    arch = architecture_of(loaded.model)
    dev = loaded.device
    pool = load_pool()
    result: dict = {"K": arch.K, "proof_dtype": arch.proof.dtype, "C": [], "B_shared": []}
    c_times, f_times = [], []
    for seed in range(seeds):
        batch = encode_probe(draw_probe(pool, seed, n), loaded.tokenizer).to(dev)
        with GatedModel(loaded.model) as gm:
            for rep in range(reps if seed == 0 else 1):
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                _sync(dev)
                start = time.perf_counter()
                control = control_autograd(gm, batch, batch_size=batch_size)
                _sync(dev)
                c_times.append(time.perf_counter() - start)
                if dev.type == "cuda" and rep == 0 and seed == 0:
                    result["peak_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
        result["C"].append(control.C)
        result["B_shared"].append(float(b_shared(control.C)))
        if seed == 0:
            ids = batch.input_ids.to(dev)
            for _ in range(reps):
                _sync(dev)
                start = time.perf_counter()
                with torch.no_grad():
                    loaded.model(input_ids=ids, use_cache=False)
                _sync(dev)
                f_times.append(time.perf_counter() - start)
    result["C_s"] = statistics.median(c_times)
    result["forward_s"] = statistics.median(f_times)
    return result


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(cos.min())


def compare_kernels(
    spec: str, kernels: list[str], device: str, seeds: int, n: int, reps: int
) -> list[dict]:
    """One row per ``dtype:attn`` kernel: ``measure``'s figures without C, and for every
    kernel after a float32 one its B_shared difference (points) and worst C-row cosine."""
    rows, reference = [], None
    for kernel in kernels:
        dtype, attn = kernel.split(":")
        try:
            got = measure(spec, dtype, attn, device, seeds, n, reps)
        except CdscopeError as exc:
            rows.append({"kernel": kernel, "refused": str(exc)})
            print(f"{spec} {kernel}: {exc}", flush=True)
            continue
        reference = got if dtype == "float32" else reference
        row = {"kernel": kernel, **{k: v for k, v in got.items() if k != "C"}}
        if reference is not None and reference is not got:
            row["B_shared_vs_fp32_points"] = [
                100 * (b - r) for b, r in zip(got["B_shared"], reference["B_shared"], strict=True)
            ]
            row["C_cosine_vs_fp32"] = min(
                _cosine(c, r) for c, r in zip(got["C"], reference["C"], strict=True)
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernels", nargs="*", default=list(KERNELS), help="dtype:attn")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-large", action="store_true", help="the embedded model only")
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {"smollm2-135m": "smollm2-135m"}
        if not args.no_large:
            models["random Qwen2 1.5B"] = str(random_large(Path(tmp) / "large"))
        for name, spec in models.items():
            for row in compare_kernels(
                spec, args.kernels, args.device, args.seeds, args.n, args.reps
            ):
                rows.append({"model": name, **row})
    print(f"\ndevice: {torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}")
    print(
        "| model | kernel | K | B_shared per seed | vs fp32 (pt) | C cos vs fp32 | C s | fwd s | peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "refused" in r:
            print(f"| {r['model']} | {r['kernel']} | refused: {r['refused']} |||||||")
            continue
        diff = ", ".join(f"{d:+.2f}" for d in r.get("B_shared_vs_fp32_points", []))
        print(
            f"| {r['model']} | {r['kernel']} | {r['K']} | "
            + ", ".join(f"{100 * b:.2f}" for b in r["B_shared"])
            + f" | {diff} | {r.get('C_cosine_vs_fp32', float('nan')):.5f} | {r['C_s']:.3f} | "
            f"{r['forward_s']:.4f} | {r.get('peak_GiB', float('nan')):.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
