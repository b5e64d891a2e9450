"""Generated tokens/s of ``cdscope.core.generation.sample`` vs one plain ``model.generate`` call.

Both sides sample the same batch (P probe prompts x S samples, left-padded, KV cache)
on the embedded model; tokens are counted up to and including each row's first EOS.
Prints medians over R repetitions and the ratio sample / plain (target >= 0.9).

    .venv/bin/python benchmarks/bench_generation.py [--prompts 8] [--samples 4]
        [--new-tokens 64] [--reps 3] [--temperature 0.6]

``--backends`` (run from .venv-vllm: ``make setup-vllm``) compares the eval engines
instead, ``--backend hf`` and ``--backend vllm``, on the embedded model in float32
(benchmarks/bench_backends.py):

    .venv-vllm/bin/python benchmarks/bench_generation.py --backends [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main() -> None:
    if "--backends" in sys.argv:
        from bench_backends import main as backends

        sys.argv.remove("--backends")
        backends()
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.6)
    args = parser.parse_args()

    from cdscope.core.generation import completion_mask, eos_token_ids, sample
    from cdscope.core.models import load_model
    from cdscope.core.probes import load_pool

    loaded = load_model()
    model, tok = loaded.model, loaded.tokenizer
    items = [item for group in load_pool().by_family.values() for item in group]
    prompts = [item.prompt for item in items[:: max(len(items) // args.prompts, 1)]]
    prompts = prompts[: args.prompts]
    rows = [p for p in prompts for _ in range(args.samples)]
    eos = eos_token_ids(model, tok)

    def plain(seed: int) -> tuple[int, float]:
        start = time.perf_counter()
        enc = tok(rows, return_tensors="pt", padding=True, padding_side="left")
        torch.manual_seed(seed)
        out = model.generate(
            **enc,
            max_new_tokens=args.new_tokens,
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
        )
        seconds = time.perf_counter() - start
        return int(completion_mask(out[:, enc["input_ids"].shape[1] :], eos).sum()), seconds

    def ours(seed: int) -> tuple[int, float]:
        r = sample(
            model,
            tok,
            prompts,
            num_samples=args.samples,
            max_new_tokens=args.new_tokens,
            temperature=args.temperature,
            seed=seed,
        )
        return r.generated_tokens, r.seconds

    plain(0), ours(0)  # warm-up
    rates: dict[str, list[float]] = {"plain": [], "sample": []}
    for rep in range(args.reps):  # interleaved so machine load hits both alike
        for name, fn in (("plain", plain), ("sample", ours)):
            tokens, seconds = fn(rep + 1)
            rates[name].append(tokens / seconds)
            print(f"  rep {rep} {name}: {tokens} tokens in {seconds:.1f} s", flush=True)
    med = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"batch: {args.prompts} prompts x {args.samples} samples, {args.new_tokens} new tokens, "
        f"T={args.temperature}, torch threads {torch.get_num_threads()}, device {loaded.device}"
    )
    for name in ("plain", "sample"):
        runs = ", ".join(f"{v:.1f}" for v in rates[name])
        print(f"{name:>7}: median {med[name]:.1f} generated tokens/s  (runs: {runs})")
    print(f"ratio sample / plain: {med['sample'] / med['plain']:.3f}  (target >= 0.9)")


if __name__ == "__main__":
    main()
