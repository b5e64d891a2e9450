"""Edge-level C vs one forward + backward per probe row, on the embedded model (issue 15).

For each probe row (n items of every family, one row per batch, as the CPU default runs):

- ``fwd+bwd``: log pi of the row's target, one forward and one backward to the input
  embeddings, parameters frozen (the reference: what any gradient readout costs);
- ``node C``:  ``cdscope.core.control.control_autograd`` (K = 2L gates on the writes);
- ``edge C``:  ``cdscope.core.edge_control.control_edges`` (E = 4L^2 + 3L + 1 edge gates).

The three are interleaved within every repetition (machine load hits all alike); each
row's time is the median over R repetitions, and the reported ratio is the median over
rows of edge C / fwd+bwd (target <= 2), on the wall clock and as process CPU time.

    PYTHONPATH=. python benchmarks/bench_edge.py [--n 2] [--reps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_eap import peak_rss_mib, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2, help="probe items per family")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from cdscope.core.batch import encode_probe
    from cdscope.core.control import control_autograd, frozen_parameters
    from cdscope.core.eap_graph import edge_count
    from cdscope.core.edge_control import control_edges
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models import load_model
    from cdscope.core.models.head import output_logits
    from cdscope.core.probes import draw_probe, load_pool

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    model = loaded.model
    items = draw_probe(load_pool(), args.seed, args.n)
    batches = [encode_probe([item], loaded.tokenizer) for item in items]

    def forward_backward(batch) -> None:  # noqa: ANN001
        local, pos, labels = batch.predicting_positions(torch.zeros(1, dtype=torch.long))
        embeds = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_()
        hidden = model.base_model(inputs_embeds=embeds, use_cache=False).last_hidden_state
        logits = output_logits(model, hidden[local, pos]).float()
        logp = -torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        torch.autograd.grad(logp, embeds)  # parameters are frozen around every run

    kinds = ("fwd+bwd", "node C", "edge C")
    with GatedModel(model) as gm, frozen_parameters(model):
        run = {
            "fwd+bwd": forward_backward,
            "node C": lambda b: control_autograd(gm, b),
            "edge C": lambda b: control_edges(model, b),
        }
        for batch in batches:  # warm-up
            for kind in kinds:
                run[kind](batch)
        times = {kind: [[] for _ in batches] for kind in kinds}
        for _ in range(args.reps):
            for i, batch in enumerate(batches):
                for kind in kinds:
                    times[kind][i].append(timed(lambda b=batch, k=kind: run[k](b)))
    print(
        f"model {loaded.name} ({loaded.num_layers} layers, E = {edge_count(loaded.num_layers)}), "
        f"{torch.get_num_threads()} thread(s), {len(batches)} probe rows, median of {args.reps} "
        f"interleaved reps, seconds per row; peak RSS {peak_rss_mib():.0f} MiB"
    )
    for clock, label in ((0, "wall clock"), (1, "process CPU time")):
        print(f"-- {label}")
        print(f"{'row':<28}{'tokens':>7}" + "".join(f"{k:>10}" for k in kinds) + f"{'edge/fb':>9}")
        ratios, node = [], []
        for i, (item, batch) in enumerate(zip(items, batches, strict=True)):
            med = {k: statistics.median(t[clock] for t in times[k][i]) for k in kinds}
            ratios.append(med["edge C"] / med["fwd+bwd"])
            node.append(med["edge C"] / med["node C"])
            print(
                f"{item.id:<28}{int(batch.lengths[0]):>7}"
                + "".join(f"{med[k]:>10.3f}" for k in kinds)
                + f"{ratios[-1]:>9.2f}"
            )
        print(
            f"edge C / fwd+bwd, median over rows: {statistics.median(ratios):.2f} (target <= 2); "
            f"edge C / node C: {statistics.median(node):.2f}"
        )


if __name__ == "__main__":
    main()
