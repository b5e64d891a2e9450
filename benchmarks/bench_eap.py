"""Edge scores vs one forward + backward of the same sample, on the embedded model (issue 6).

For each of n probe samples of one family (targets as answers, one sample per batch):

- ``eap``:        ``cdscope.core.eap.edge_scores`` (forward with hooks, one backward to the
                  4L + 1 path inputs, the [U, T*D] x [T*D, C] product);
- ``fwd+bwd``:    the same loss (mean NLL of the answer tokens), one forward and one
                  backward to the input embeddings, parameters frozen (what EAP needs);
- ``fwd+bwd+W``:  the same with parameter gradients (an ordinary training step's backward).

Prints the best-of-R seconds per sample of each (R repetitions, interleaved so machine
load hits all three alike), on the wall clock and as process CPU time, the ratios (target: eap <= 2 x fwd+bwd) and the peak resident memory after
loading, after the plain passes and after the EAP passes.

With one thread (the default) the process CPU time is what the computation costs, however
loaded the machine is; with several, OpenMP threads spin while a sibling is descheduled,
so on a shared machine CPU time inflates along with the wall clock.

    PYTHONPATH=. python benchmarks/bench_eap.py [--family math] [--n 3] [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import torch


def peak_rss_mib() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def timed(fn) -> tuple[float, float]:  # noqa: ANN001
    """(wall seconds, CPU seconds of this process: all threads, unaffected by others' load)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def report(items, batches, times: dict, clock: int, label: str) -> None:  # noqa: ANN001
    """Per-sample best-of-R seconds and ratios on one clock."""
    print(f"-- {label}")
    print(f"{'sample':<32}{'tokens':>7}{'fwd+bwd':>10}{'fwd+bwd+W':>11}{'eap':>9}{'eap/fb':>8}")
    ratios, totals = [], dict.fromkeys(times, 0.0)
    for i, (item, batch) in enumerate(zip(items, batches, strict=True)):
        best = {key: min(run[clock] for run in times[key][i]) for key in times}
        ratios.append(best["eap"] / best["fwd+bwd"])
        totals = {key: totals[key] + best[key] for key in times}
        print(
            f"{item.id:<32}{int(batch.lengths[0]):>7}{best['fwd+bwd']:>10.3f}"
            f"{best['fwd+bwd+W']:>11.3f}{best['eap']:>9.3f}{ratios[-1]:>8.2f}"
        )
    print(
        f"ratio eap / fwd+bwd (frozen), median over samples: {statistics.median(ratios):.2f}"
        f" (target <= 2); eap / fwd+bwd+W over all samples: "
        f"{totals['eap'] / totals['fwd+bwd+W']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", default="math")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: CPU time is load-proof)"
    )
    args = parser.parse_args()

    from cdscope.core.batch import encode_probe
    from cdscope.core.control import frozen_parameters
    from cdscope.core.eap import edge_scores
    from cdscope.core.models import load_model
    from cdscope.core.models.head import output_logits
    from cdscope.core.probes import draw_probe, load_pool

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    model = loaded.model
    rss_loaded = peak_rss_mib()
    items = draw_probe(load_pool(), args.seed, args.n, [args.family])
    batches = [encode_probe([item], loaded.tokenizer) for item in items]

    def forward_backward(batch, weights: bool) -> None:  # noqa: ANN001
        local, pos, labels = batch.predicting_positions(torch.zeros(1, dtype=torch.long))
        embeds = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_()
        hidden = model.base_model(inputs_embeds=embeds, use_cache=False).last_hidden_state
        logits = output_logits(model, hidden[local, pos]).float()
        loss = torch.nn.functional.cross_entropy(logits, labels)  # mean NLL of the answer
        if weights:
            loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            torch.autograd.grad(loss, embeds)

    def plain(batch) -> None:  # noqa: ANN001
        with frozen_parameters(model):
            forward_backward(batch, weights=False)

    times: dict[str, list] = {"eap": [], "fwd+bwd": [], "fwd+bwd+W": []}
    for batch in batches:  # warm-up, and the peak memory of each kind of pass in turn
        plain(batch)
    rss_plain = peak_rss_mib()
    for batch in batches:
        edge_scores(model, batch)
    rss_eap = peak_rss_mib()
    for batch in batches:
        runs = {key: [] for key in times}
        for _ in range(args.reps):
            runs["fwd+bwd"].append(timed(lambda b=batch: plain(b)))
            runs["fwd+bwd+W"].append(timed(lambda b=batch: forward_backward(b, weights=True)))
            runs["eap"].append(timed(lambda b=batch: edge_scores(model, b)))
        for key in times:
            times[key].append(runs[key])

    print(
        f"model {loaded.name} ({loaded.num_layers} layers), {torch.get_num_threads()} threads, "
        f"best of {args.reps} reps, seconds per sample"
    )
    for clock, label in ((0, "wall clock"), (1, "process CPU time")):
        report(items, batches, times, clock, label)
    print(
        f"peak RSS MiB: after load {rss_loaded:.0f}, after fwd+bwd {rss_plain:.0f}, "
        f"after eap {rss_eap:.0f}, after fwd+bwd+W (weight grads) {peak_rss_mib():.0f}"
    )


if __name__ == "__main__":
    main()
