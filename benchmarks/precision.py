"""The precision study of issue 24: bfloat16, float16 and float32 against float64 (docs/precision.md).

For the embedded SmolLM2-135M (the shipped probe, seeds 0..S-1, ``--embedded-n`` items per
family) and seven tiny random architectures saved with ``save_pretrained`` and loaded by
path (dense: GPT-2; GQA: Llama; MoE: Mixtral; post-norm: OLMo-2; parallel: GPT-NeoX;
hybrid: Jamba; MLA-MoE: DeepSeek-V3; a random 3-family x 3-row probe of 24-token rows per
seed), every quantity is measured in each dtype and compared with the same checkpoint in
float64 *throughout* (``cdscope.core.models.float64``: no float32 step left in the forward):

- C: per family row, relative L2 error and cosine (worst row reported); l_m relative error;
- B_shared(C) and B_dir(C) differences in points (percent of the [0, 1] scale);
- edge C (``cdscope probe --granularity edge``): relative error and cosine of the whole matrix;
- the regulariser gradient dR/dtheta (tiny models): cosine against the float64 exact one,
  for the exact estimator and for the training default (folded, eps 0.01) in each dtype
  (``refused`` where cdscope refuses it);
- plain float64 (transformers' float64, with its float32 RMSNorm / rotary steps) is a row
  too: the floor every "float64" check in the suite stands on;
- bfloat16 with the output head in bfloat16 (``head bf16``) next to the default (the head
  at the scored positions in float32): what the mixed-precision head buys;
- speed: C by autograd in bfloat16 / float16 vs float32 on the embedded model, seed 0,
  medians of interleaved repeats in this process.

Writes ``OUT/precision.parquet`` (one row per model, seed, variant, measure), the figure
(``--figure``, default ``OUT/precision.png``) and prints the Markdown tables of
docs/precision.md:

    .venv/bin/python benchmarks/precision.py --threads 1 --figure docs/img/precision.png
    .venv/bin/python benchmarks/precision.py --seeds 1 --tiny llama --no-embedded  # a look
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cdscope.analysis.spectral import b_dir, b_shared
from cdscope.core import likelihood
from cdscope.core.batch import ProbeBatch, encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.edge_control import control_edges
from cdscope.core.gating.model import GatedModel
from cdscope.core.models.float64 import float64_throughout
from cdscope.core.models.loading import load_model
from cdscope.core.probes import draw_probe, load_pool
from cdscope.core.regularizer import exact_grad, regularizer_grad
from cdscope.errors import CdscopeError
from cdscope.tools import tiny

TINY = {
    "gpt2": "dense",
    "llama": "GQA",
    "mixtral": "MoE",
    "olmo2": "post-norm",
    "gpt_neox": "parallel",
    "jamba": "hybrid",
    "deepseek_v3": "MLA + MoE",
}
#: (label, dtype, head in float32) of every variant measured against the reference
VARIANTS = (
    ("float64", "float64", True),
    ("float32", "float32", True),
    ("bfloat16", "bfloat16", True),
    ("bfloat16, head bf16", "bfloat16", False),
    ("float16", "float16", True),
)
EMBEDDED = "smollm2-135m"


def random_probe(seed: int, families: int = 3, n: int = 3, length: int = 24) -> ProbeBatch:
    """``families`` x ``n`` rows of random tokens, the last 8 of each scored."""
    gen = torch.Generator().manual_seed(1000 + seed)
    rows = families * n
    ids = torch.randint(3, tiny.VOCAB, (rows, length), generator=gen)
    lengths = torch.full((rows,), length)
    return ProbeBatch(
        input_ids=ids,
        lengths=lengths,
        target_start=lengths - 8,
        families=[f"f{m}" for m in range(families)],
        row_family=torch.arange(families).repeat_interleave(n),
        item_ids=[f"f{r // n}/{r % n}" for r in range(rows)],
    )


@contextlib.contextmanager
def narrow_head(on: bool):
    """The output head in the model's dtype (what cdscope did before issue 24) while on."""
    if not on:
        yield
        return
    original = likelihood.output_logits
    likelihood.output_logits = lambda model, hidden: original(model, hidden, wide=False)
    try:
        yield
    finally:
        likelihood.output_logits = original


def _rows(x: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Worst per-row relative error and worst per-row cosine of ``x`` against ``ref``."""
    rel = np.linalg.norm(x - ref, axis=1) / np.linalg.norm(ref, axis=1)
    cos = (x * ref).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(ref, axis=1)
    return float(rel.max()), float(cos.min())


def _whole(x: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    x, ref = x.ravel(), ref.ravel()
    rel = np.linalg.norm(x - ref) / np.linalg.norm(ref)
    return float(rel), float(x @ ref / np.linalg.norm(x) / np.linalg.norm(ref))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def measure(spec: str, dtype: str, batch_of, edges: bool, grads: bool, exact: bool = False):  # noqa: ANN001, ANN201
    """C (autograd), edge C and the two regulariser gradients of ``spec`` in ``dtype``."""
    loaded = load_model(spec, device="cpu", dtype=dtype, attn="eager")
    model = loaded.model
    if exact:
        model.to(torch.float64)  # modules transformers keeps in float32 (routers) too
    batch = batch_of(loaded.tokenizer)
    out: dict = {}
    with float64_throughout() if exact else contextlib.nullcontext():
        with GatedModel(model) as gm:
            start = time.perf_counter()
            out["control"] = control_autograd(gm, batch, batch_size=1)
            out["seconds"] = time.perf_counter() - start
            if grads:
                out["exact"] = exact_grad(gm, batch, batch_size=1).flat().cpu()
                try:
                    out["folded"] = regularizer_grad(gm, batch, batch_size=1).flat().cpu()
                except CdscopeError as exc:
                    out["folded"] = str(exc).split(":")[0]
        if edges:
            out["edges"] = control_edges(model, batch, batch_size=1).C
    return out


def compare(model: str, seed: int, label: str, got: dict, ref: dict) -> list[dict]:
    C, R = got["control"].C, ref["control"].C  # noqa: N806
    rel, cos = _rows(C, R)
    values = {
        "C_rel_error": rel,
        "C_cosine": cos,
        "l_rel_error": float(np.max(np.abs(got["control"].ell / ref["control"].ell - 1))),
        "B_shared_points": 100 * float(b_shared(C) - b_shared(R)),
        "B_dir_points": 100 * float(b_dir(C) - b_dir(R)),
        "C_seconds": got["seconds"],
    }
    if "edges" in got:
        values["edge_C_rel_error"], values["edge_C_cosine"] = _whole(got["edges"], ref["edges"])
    if "exact" in got:
        values["grad_exact_cosine"] = _cos(got["exact"], ref["exact"])
        folded = got["folded"]
        values["grad_folded_cosine"] = (
            _cos(folded, ref["exact"]) if isinstance(folded, torch.Tensor) else float("nan")
        )
    return [
        {"model": model, "seed": seed, "variant": label, "measure": k, "value": v}
        for k, v in values.items()
    ]


#: the variants measured on every seed of the embedded model (the others, and edge C, on
#: seed 0 only: float16 runs emulated on this CPU, ~15x slower than bfloat16)
EVERY_SEED = ("float32", "bfloat16", "bfloat16, head bf16")


def study(
    model: str, spec: str, batch_of, seeds: int, edges: bool, grads: bool, full_seeds: int
) -> list[dict]:  # noqa: ANN001
    """Every variant against float64 throughout on seeds ``0..seeds-1``; beyond
    ``full_seeds`` only ``EVERY_SEED`` and no edge C."""
    rows = []
    for seed in range(seeds):

        def for_seed(tokenizer, seed=seed):  # noqa: ANN001, ANN202
            return batch_of(tokenizer, seed)

        full = seed < full_seeds
        ref = measure(spec, "float64", for_seed, edges and full, grads, exact=True)
        rows += compare(model, seed, "float64 throughout", ref, ref)
        for label, dtype, wide in VARIANTS:
            if not full and label not in EVERY_SEED:
                continue
            with narrow_head(not wide):
                got = measure(spec, dtype, for_seed, edges and full, grads)
            rows += compare(model, seed, label, got, ref)
            print(f"{model} seed {seed} {label}: {got['seconds']:.1f} s", flush=True)
    return rows


def speed(reps: int, n: int) -> list[dict]:
    """Medians of interleaved C timings on the embedded model, seed 0, ``n`` per family."""
    loaded = {
        dt: load_model(EMBEDDED, device="cpu", dtype=dt)
        for dt in ("float32", "bfloat16", "float16")
    }
    batch = encode_probe(draw_probe(load_pool(), 0, n), loaded["float32"].tokenizer)
    times: dict[str, list[float]] = {dt: [] for dt in loaded}
    for _ in range(reps):
        for dt, lm in loaded.items():
            with GatedModel(lm.model) as gm:
                start = time.perf_counter()
                control_autograd(gm, batch, batch_size=1)
                times[dt].append(time.perf_counter() - start)
    base = statistics.median(times["float32"])
    return [
        {
            "model": EMBEDDED,
            "seed": 0,
            "variant": dt,
            "measure": "C_seconds_median",
            "value": statistics.median(t),
        }
        for dt, t in times.items()
    ] + [
        {
            "model": EMBEDDED,
            "seed": 0,
            "variant": dt,
            "measure": "C_time_vs_float32",
            "value": statistics.median(t) / base,
        }
        for dt, t in times.items()
    ]


def _cell(measure: str, values: pd.Series) -> str:
    """The worst of ``values`` over seeds: the lowest cosine, else the largest magnitude."""
    if values.empty:
        return ""
    if values.isna().all():
        return "refused"
    values = values.dropna()
    if "cosine" in measure:
        return f"{values.min():.6f}"
    worst = values.loc[values.abs().idxmax()]
    if "points" in measure:
        return f"{worst:+.2f}"
    return f"{worst:.2f}" if "seconds" in measure or "time" in measure else f"{worst:.1e}"


def table(frame: pd.DataFrame, measures: list[str]) -> str:
    """Markdown: one row per (model, variant), the worst value over seeds."""
    lines = ["| model | variant | " + " | ".join(measures) + " |"]
    lines.append("|---" * (len(measures) + 2) + "|")
    for (model, variant), group in frame.groupby(["model", "variant"], sort=False):
        cells = [_cell(m, group.loc[group["measure"] == m, "value"]) for m in measures]
        if any(cells):
            lines.append(f"| {model} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the figure's panels: (measure, title, how a value is drawn)
PANELS = (
    ("C_rel_error", "C: worst row relative error", abs),
    ("B_shared_points", "B_shared(C) minus float64 (points)", None),
    ("edge_C_rel_error", "edge C: relative error", abs),
    ("grad_exact_cosine", "regulariser gradient (exact): 1 - cosine", lambda v: 1 - v),
)


def figure(frame: pd.DataFrame, path: Path) -> None:
    """One panel per ``PANELS`` entry, one dot per (model, variant, seed), against float64
    throughout; log scale except for the signed B_shared difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [v for v, *_ in VARIANTS]
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    for ax, (measure, title, draw) in zip(axes.flat, PANELS, strict=True):
        data = frame[(frame["measure"] == measure) & frame["variant"].isin(shown)]
        models = list(dict.fromkeys(data["model"]))
        width = 0.8 / len(shown)
        for i, variant in enumerate(shown):
            part = data[data["variant"] == variant]
            for j, model in enumerate(models):
                values = part.loc[part["model"] == model, "value"].dropna().to_numpy()
                if values.size == 0:
                    continue
                y = values if draw is None else np.maximum(draw(values), 1e-17)
                x = j + (i - len(shown) / 2 + 0.5) * width
                ax.scatter(
                    np.full(y.size, x), y, s=14, color=f"C{i}", label=variant if j == 0 else None
                )
        ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if draw is None:
            ax.axhline(0, color="grey", lw=0.5)
        else:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("cdscope in each dtype against the same checkpoint in float64 throughout")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/precision")
    parser.add_argument("--figure", help="where the PNG goes (default: OUT/precision.png)")
    parser.add_argument("--seeds", type=int, default=3, help="embedded-model probe seeds")
    parser.add_argument("--tiny-seeds", type=int, default=2, help="random probes per tiny model")
    parser.add_argument("--embedded-n", type=int, default=1, help="items per family")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--tiny", nargs="*", default=list(TINY), help="tiny model types")
    parser.add_argument("--no-embedded", action="store_true")
    parser.add_argument("--no-edges", action="store_true")
    parser.add_argument(
        "--embedded-grads",
        action="store_true",
        help="regulariser gradients of the 135M model too (slow)",
    )
    parser.add_argument("--reps", type=int, default=3, help="speed repeats")
    parser.add_argument("--resume", action="store_true", help="keep the models OUT has")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path = out / "precision.parquet"
    done = pd.read_parquet(path) if args.resume and path.exists() else pd.DataFrame()
    rows: list[dict] = done.to_dict("records")

    def keep(new: list[dict]) -> None:  # written after every model: a stop loses one model
        rows.extend(new)
        pd.DataFrame(rows).to_parquet(path)

    measured = set(done["model"]) if len(done) else set()
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.tiny:
            name = f"{model_type} ({TINY.get(model_type, '')})"
            if name in measured:
                continue
            torch.manual_seed(0)
            model = tiny.tiny_model(model_type)
            directory = tiny.save_checkpoint(model, Path(tmp) / model_type)
            batches = lambda tokenizer, seed: random_probe(seed)  # noqa: E731
            edges = not args.no_edges
            seeds = args.tiny_seeds
            keep(study(name, str(directory), batches, seeds, edges, True, seeds))
    if not args.no_embedded and EMBEDDED not in measured:
        pool = load_pool()
        keep(
            study(
                EMBEDDED,
                EMBEDDED,
                lambda tokenizer, seed: encode_probe(
                    draw_probe(pool, seed, args.embedded_n), tokenizer
                ),
                args.seeds,
                not args.no_edges,
                args.embedded_grads,
                1,
            )
            + speed(args.reps, args.embedded_n)
        )
    frame = pd.DataFrame(rows)
    figure_path = Path(args.figure) if args.figure else out / "precision.png"
    figure(frame, figure_path)
    shown = frame[frame["variant"] != "float64 throughout"]
    print(
        table(shown, ["C_rel_error", "C_cosine", "l_rel_error", "B_shared_points", "B_dir_points"])
    )
    print()
    print(
        table(
            shown, ["edge_C_rel_error", "edge_C_cosine", "grad_exact_cosine", "grad_folded_cosine"]
        )
    )
    print()
    print(table(frame, ["C_seconds", "C_seconds_median", "C_time_vs_float32"]))
    print(f"\nwall time {time.perf_counter() - start:.0f} s; wrote {path}, {figure_path}")


if __name__ == "__main__":
    main()
