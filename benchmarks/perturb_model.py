"""Save a perturbed copy of a model, for paired-comparison demos and checks.

Each weight matrix W gets W + scale * std(W) * N(0, 1) noise (seeded), so the copy has
the same architecture and K but a different control matrix.

    .venv/bin/python benchmarks/perturb_model.py --out results/perturbed --scale 0.05
    .venv/bin/cdscope bshared --model smollm2-135m --model results/perturbed --seeds 3 --plot fig.png
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from cdscope.core.models import load_model

    loaded = load_model(args.model, device="cpu", dtype="float32")
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for param in loaded.model.parameters():
            if param.dim() == 2:
                noise = torch.randn(param.shape, generator=generator)
                param.add_(args.scale * param.std() * noise)
    loaded.model.save_pretrained(args.out)
    loaded.tokenizer.save_pretrained(args.out)
    print(f"saved {args.model} + {args.scale} x std noise (seed {args.seed}) to {args.out}")


if __name__ == "__main__":
    main()
