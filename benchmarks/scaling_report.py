"""Tables, fitted laws, the "what fits where" arithmetic and the plot of ``scaling.py``.

Time law (per operation): cpu seconds = k * params^a * tokens^b, least squares in log
space over every configuration that ran the operation (``scaling_fit.fit_power_law``).

Memory law (per operation): peak RSS = RSS before the operation + extra, and
extra = bytes per token x tokens; for the proxy, extra = alpha x weights (its gradient
accumulator, one backward's fresh parameter gradients, transients) + rho x C's extra on
the same probe, least squares over the measured proxy points. Bytes per token of C is fitted over the
four architectures as beta_h * L * h + beta_i * L * i (L layers, h hidden, i
intermediate; ``fit_linear`` without intercept; a vocabulary term came out negative, so
it is left out) and extrapolated from it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scaling_fit import fit_linear, fit_power_law

GB = 1e9
OPS = ("forward", "control", "proxy")
#: models the arithmetic is done for: params, layers, hidden, intermediate, vocab
TARGETS = {
    "Qwen2.5-7B": (7.6e9, 28, 3584, 18944, 152064),
    "Llama-3-70B": (70.6e9, 80, 8192, 28672, 128256),
}
#: reference probe (SPEC §4: n = 3 per family, 3 shipped families; GPU default: one
#: padded batch): padded width ~300 tokens for seeds 0-2 (269-295), 428 the pool's longest
REFERENCE_TOKENS = {"reference 9 x 300": 9 * 300, "worst case 9 x 428": 9 * 428}
GPU_BYTES = 80 * GB
USABLE = 0.9  # of a GPU's memory left for tensors (CUDA context, allocator slack)


def _points(results: list[dict], op: str) -> list[dict]:
    return [r for r in results if op in r["ops"]]


def _size_sweep(results: list[dict]) -> list[dict]:
    """The configurations at the smallest token count (one per model), by size."""
    tokens = min(r["tokens"] for r in results)
    return sorted((r for r in results if r["tokens"] == tokens), key=lambda r: r["params"])


def _extra(r: dict, op: str) -> float:
    v = r["ops"][op]
    return v["peak_rss"] - v["rss_before"]


def print_table(results: list[dict]) -> None:
    print(f"{'model':<14} {'params':>7} {'rows x T':>8} {'op':<8} {'cpu s':>7} {'wall s':>7} "
          f"{'x fwd':>6} {'peak GB':>8} {'extra GB':>8}")  # fmt: skip
    for r in results:
        fwd = r["ops"]["forward"]["median_s"]
        for op, v in r["ops"].items():
            print(f"{r['model']:<14} {r['params'] / 1e6:>6.0f}M {r['rows']:>3} x {r['T']:<4}"
                  f" {op:<8} {v['median_s']:>7.2f} {np.median(v['wall_s']):>7.2f}"
                  f" {v['median_s'] / fwd:>6.2f} {v['peak_rss'] / GB:>8.2f}"
                  f" {_extra(r, op) / GB:>8.3f}")  # fmt: skip
    print("weights (RSS after build - RSS of the libraries) vs params x 4 bytes:")
    for r in {r["model"]: r for r in results}.values():
        print(f"  {r['model']:<14} {(r['rss_model'] - r['rss_libs']) / GB:6.2f} GB measured, "
              f"{r['params'] * 4 / GB:6.2f} GB expected; ready (after the gate proof) "
              f"{r['rss_ready'] / GB:.2f} GB")  # fmt: skip


def time_laws(results: list[dict]) -> dict:
    laws = {}
    for op in OPS:
        pts = _points(results, op)
        t = np.array([r["ops"][op]["median_s"] for r in pts])
        params = np.array([r["params"] for r in pts], dtype=float)
        tokens = np.array([r["tokens"] for r in pts], dtype=float)
        laws[op] = fit_power_law(t, params, tokens)
        a, b = laws[op].exponents
        exact = " (as many points as unknowns: exact, no check)" if len(pts) == 3 else ""
        print(f"time law {op:<8}: cpu s = {laws[op].coefficient:.3g} x params^{a:.2f} x "
              f"tokens^{b:.2f}   ({len(pts)} points, rms log residual "
              f"{laws[op].rms_log:.3f}){exact}")  # fmt: skip
    return laws


def memory_laws(results: list[dict]) -> dict:
    """Bytes per token of control (architecture fit); the proxy's extra in weights and C's."""
    ctrl = _size_sweep(results)
    per_token = np.array([_extra(r, "control") / r["tokens"] for r in ctrl])
    L = np.array([r["layers"] for r in ctrl], dtype=float)  # noqa: N806
    h = np.array([r["hidden"] for r in ctrl], dtype=float)
    i = np.array([r["intermediate"] for r in ctrl], dtype=float)
    arch = fit_linear(per_token, L * h, L * i, intercept=False)
    print("control extra bytes per token = "
          f"{arch.slopes[0]:.1f} x L*h + {arch.slopes[1]:.1f} x L*i"
          f"   (fp32; rms residual {arch.rms / 1e3:.0f} kB/token over {len(ctrl)} models: "
          + ", ".join(f"{r['model']} {p / 1e6:.2f} MB" for r, p in zip(ctrl, per_token, strict=True))
          + ")")  # fmt: skip
    small = [r for r in results if r["model"] == "smollm2-135m"]
    for op in ("forward", "control", "proxy"):
        pts = _points(small, op)
        if len(pts) >= 2:
            law = fit_linear(np.array([_extra(r, op) for r in pts]),
                             np.array([r["tokens"] for r in pts], dtype=float))  # fmt: skip
            print(f"135M {op:<8} extra = {law.intercept / 1e6:.0f} MB + {law.slopes[0] / 1e6:.3f} "
                  f"MB/token x tokens   ({len(pts)} points, rms {law.rms / 1e6:.0f} MB)")  # fmt: skip
    pts = _points(results, "proxy")
    weights = np.array([4.0 * r["params"] for r in pts])
    ctrl_extra = np.array([_extra(r, "control") for r in pts])
    proxy_extra = np.array([_extra(r, "proxy") for r in pts])
    proxy = fit_linear(proxy_extra, weights, ctrl_extra, intercept=False)
    print(
        f"proxy extra = {proxy.slopes[0]:.2f} x fp32 weights + {proxy.slopes[1]:.2f} x control's "
        f"extra (same probe)   ({len(pts)} points, rms {proxy.rms / 1e6:.0f} MB): "
        + ", ".join(
            f"{r['model']} {r['tokens']} tokens {e / GB:.2f} GB measured, "
            f"{float(proxy.predict(w, c)) / GB:.2f} GB fitted"
            for r, e, w, c in zip(pts, proxy_extra, weights, ctrl_extra, strict=True)
        )
    )
    return {"arch": arch, "proxy_memory": proxy}


def fits_where(laws: dict) -> list[str]:
    """Markdown lines: memory arithmetic for TARGETS at REFERENCE_TOKENS."""
    arch = laws["arch"]
    alpha, rho = laws["proxy_memory"].slopes
    lines = ["| model | probe tokens | what | weights | activations | gradients | total | 80 GB GPUs |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, (P, L, h, i, _vocab) in TARGETS.items():  # noqa: N806
        per_token32 = float(arch.predict(L * h, L * i))
        for label, N in REFERENCE_TOKENS.items():  # noqa: N806
            for what, wbytes, abytes, grads in (
                ("C, bf16", 2, per_token32 / 2 * N, 0.0),
                ("proxy grad, fp32", 4, rho * per_token32 * N, alpha * 4 * P),
                ("proxy grad, bf16 (refused today)", 2, rho * per_token32 / 2 * N, alpha * 2 * P),
            ):
                weights = wbytes * P
                total = weights + abytes + grads
                gpus = math.ceil(total / (USABLE * GPU_BYTES))
                lines.append(f"| {name} | {N} ({label}) | {what} | {weights / GB:.1f} GB | "
                             f"{abytes / GB:.2f} GB | {grads / GB:.1f} GB | {total / GB:.1f} GB | "
                             f"{gpus} |")  # fmt: skip
    return lines


def plot(results: list[dict], laws: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid_axes = plt.subplots(2, 2, figsize=(13, 10))
    axes = grid_axes.ravel()
    sized = _size_sweep(results)
    size_tokens = sized[0]["tokens"]
    small = sorted((r for r in results if r["model"] == "smollm2-135m"), key=lambda r: r["tokens"])
    colours = {"forward": "tab:blue", "control": "tab:orange", "proxy": "tab:red"}
    grid = np.geomspace(1e8, 2e9, 50)
    for op in OPS:
        pts = [r for r in sized if op in r["ops"]]
        axes[0].loglog([r["params"] for r in pts], [r["ops"][op]["median_s"] for r in pts],
                       "o", color=colours[op], label=f"{op} (measured)")  # fmt: skip
        a, b = laws[op].exponents
        axes[0].loglog(grid, laws[op].predict(grid, size_tokens), "--", color=colours[op],
                       label=f"fit: params^{a:.2f}")  # fmt: skip
        pts = [r for r in small if op in r["ops"]]
        axes[1].loglog([r["tokens"] for r in pts], [r["ops"][op]["median_s"] for r in pts],
                       "o", color=colours[op], label=f"{op} (measured)")  # fmt: skip
        tgrid = np.geomspace(80, 700, 30)
        axes[1].loglog(tgrid, laws[op].predict(small[0]["params"], tgrid), "--",
                       color=colours[op], label=f"fit: tokens^{b:.2f}")  # fmt: skip
    for op in OPS:
        pts = [r for r in sized if op in r["ops"]]
        axes[2].plot([r["params"] / 1e9 for r in pts], [r["ops"][op]["peak_rss"] / GB for r in pts],
                     "o-", color=colours[op], label=f"{op} peak RSS")  # fmt: skip
    axes[2].plot([r["params"] / 1e9 for r in sized], [4 * r["params"] / GB for r in sized],
                 "s:", color="grey", label="fp32 weights (4 bytes x params)")  # fmt: skip
    for op in OPS:
        pts = [r for r in small if op in r["ops"]]
        tokens = np.array([r["tokens"] for r in pts], dtype=float)
        extra = np.array([_extra(r, op) for r in pts]) / GB
        axes[3].plot(tokens, extra, "o", color=colours[op], label=f"{op} (measured)")
        if len(pts) >= 2:
            law = fit_linear(extra, tokens)
            axes[3].plot(
                tokens,
                law.predict(tokens),
                "--",
                color=colours[op],
                label=f"fit: {law.intercept:.2f} + {law.slopes[0] * 1e3:.2f} MB x tokens",
            )
    axes[0].set(
        xlabel="parameters",
        ylabel="CPU seconds (1 thread, median)",
        title=f"time vs model size ({sized[0]['rows']} x {sized[0]['T']} tokens)",
    )
    axes[1].set(
        xlabel="probe tokens (rows x T)",
        ylabel="CPU seconds (1 thread, median)",
        title="time vs probe tokens (SmolLM2-135M)",
    )
    axes[2].set(
        xlabel="parameters (billions)",
        ylabel="GB",
        title=f"peak RSS during the operation ({size_tokens} tokens, fp32)",
    )
    axes[3].set(
        xlabel="probe tokens (rows x T)",
        ylabel="GB above the RSS before the operation",
        title="memory the operation adds (SmolLM2-135M)",
    )
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "cdscope cost measured on CPU (1 thread, fp32, sdpa, one padded batch); GPU not measured"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def report(results: list[dict], plot_path: Path | None) -> None:
    print_table(results)
    laws = time_laws(results)
    sized = _size_sweep(results)
    print("C time / forward time per size: " + ", ".join(
        f"{r['model']} {r['ops']['control']['median_s'] / r['ops']['forward']['median_s']:.2f}"
        for r in sized))  # fmt: skip
    laws.update(memory_laws(results))
    print("\n".join(fits_where(laws)))
    if plot_path:
        plot(results, laws, plot_path)
