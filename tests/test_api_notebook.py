"""The notebook side of the API: tidy audit tables, figures returned (and drawn on a
caller's Axes) without pyplot, short reprs; and the figure fixes of issue 28 (corrected
B_shared beside the plain one, a one-seed legend clear of the bars, every eap-info layer
labelled)."""

from __future__ import annotations

import io
import itertools
from html.parser import HTMLParser

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

import cdscope
from cdscope import CdscopeError
from cdscope.commands.audit import PER_SEED_COLUMNS
from tests.helpers import byte_tokenizer, tiny_model, write_pool


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    """Two tiny models measured on 3 seeds (n = 2) of a 3-family pool."""
    pool = write_pool(
        tmp_path_factory.mktemp("pool") / "p.jsonl", {"math": 4, "code": 4, "logic": 4}
    )
    models = [
        cdscope.load_model(tiny_model("llama", seed=s), byte_tokenizer(), name=name)
        for s, name in ((0, "base"), (1, "tuned"))
    ]
    return cdscope.measure(models, pool, seeds=3, n=2, progress=False)


@pytest.fixture(scope="module")
def one_seed(frame):
    first = frame[(frame["model"] == "base") & (frame["seed"] == 0)]
    return cdscope.bshared(first)


def _control(frame: pd.DataFrame, model: str, seed: int) -> tuple[list[str], np.ndarray]:
    part = frame[(frame["model"] == model) & (frame["seed"] == seed) & ~frame["dropped"]]
    C = part.pivot(index="family", columns="gate", values="C").sort_index()  # noqa: N806
    return list(C.index), C.to_numpy()


def test_decompose_tables_are_tidy_and_match_an_explicit_loop(frame) -> None:
    result = cdscope.decompose(frame)
    per_seed = result.per_seed
    assert list(per_seed.columns) == PER_SEED_COLUMNS
    assert not per_seed["measure"].str.contains(r"\[").any()  # no family packed in a name
    assert set(per_seed.loc[per_seed["value_unit"] == "gates", "measure"]) == {"PR"}
    assert set(per_seed.loc[per_seed["measure"] == "B_dir", "family"].isna()) == {True}
    for (model, seed), group in per_seed.groupby(["model", "seed"]):
        families, C = _control(frame, model, seed)  # noqa: N806
        for m, family in enumerate(families):  # the slow twin: PR and |cos| written out
            row = C[m]
            pr = sum(abs(x) for x in row) ** 2 / sum(x * x for x in row)
            got = group[(group["measure"] == "PR") & (group["family"] == family)]
            # floor 2.4e-16 measured at 1 and 2 threads; 1e-12 leaves a 4000x margin
            assert got["value"].item() == pytest.approx(pr, rel=1e-12)
        for (i, a), (j, b) in itertools.combinations(enumerate(families), 2):
            cos = abs(C[i] @ C[j]) / np.sqrt((C[i] @ C[i]) * (C[j] @ C[j]))
            got = group[(group["measure"] == "abs_cos") & (group["family"] == a)]
            got = got[got["family_b"] == b]
            # floor 3.6e-15 measured at 1 and 2 threads; 1e-12 leaves a 270x margin
            assert got["value"].item() == pytest.approx(cos, rel=1e-12)
    summary = result.summary.query("measure == 'PR' and family == 'code'")
    assert set(summary["value_unit"]) == {"gates"}
    for row in summary.itertuples():
        seeds = per_seed.query("measure == 'PR' and family == 'code' and model == @row.model")
        assert row.mean == pytest.approx(seeds["value"].mean(), rel=1e-12)  # one mean: ~1e-16
        assert row.n_seeds == 3
    paired = result.paired.query("measure == 'abs_cos'")
    assert len(paired) == 3 and set(paired["family_b"]) <= {"logic", "math"}


def test_plot_returns_a_figure_without_pyplot_or_style_leaks(frame, tmp_path) -> None:
    import matplotlib.pyplot as plt

    before = {key: matplotlib.rcParams[key] for key in ("font.size", "axes.spines.top")}
    result = cdscope.bshared(frame)
    fig = cdscope.plot(result)
    assert isinstance(fig, Figure) and len(fig.axes) == 2  # bars + paired forest
    assert plt.get_fignums() == []  # not a pyplot figure: shown once, never twice
    assert {key: matplotlib.rcParams[key] for key in before} == before
    assert fig._repr_png_().startswith(b"\x89PNG")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == [  # the corrected one beside, each saying which is the paper's
        "B_shared(C)\nplain: the paper's",
        "B_shared(C)\ncorrected\nnot comparable\nwith plain",
    ]
    assert not (tmp_path / "x.png").exists()


def test_plot_draws_on_the_callers_axes(frame, tmp_path) -> None:
    mine = Figure(figsize=(4, 3))
    ax = mine.add_subplot()
    result = cdscope.decompose(frame)
    out = cdscope.plot(result, tmp_path / "d.png", ax=ax)
    assert out is mine and mine.axes == [ax]  # no panels added to a figure that is not ours
    assert len(ax.patches) == 2 * 3  # one bar per model and measure
    means = result.summary.set_index(["model", "measure"])["mean"]
    heights = sorted(p.get_height() for p in ax.patches)
    expected = sorted(100 * means.loc[(m, x)] for m in ("base", "tuned")
                      for x in ("B_shared_C", "B_dir", "B_norm"))  # fmt: skip
    np.testing.assert_allclose(heights, expected, rtol=1e-12)
    assert (tmp_path / "d.png").read_bytes().startswith(b"\x89PNG")
    ref = cdscope.random_reference(3, 6, trials=200)
    assert cdscope.plot(ref, ax=ax) is mine
    with pytest.raises(CdscopeError, match="ax must be a matplotlib Axes"):
        cdscope.plot(result, ax="left")


def test_a_one_seed_plot_keeps_the_legend_off_the_bars(one_seed) -> None:
    from cdscope.output.plots import audit_figure

    r = one_seed
    single = audit_figure("B_shared(C)", r.per_seed, r.summary, r.paired, ["B_shared_C"])
    for fig in (cdscope.plot(r), single):  # one bar filling the axes: the case of issue 28
        fig.savefig(io.BytesIO(), format="png")  # lay out, as a file write does
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        assert ax.patches
        for bar in ax.patches:
            assert not legend.overlaps(bar.get_window_extent()), bar
        for dots in ax.collections:  # the seed dots
            for x, y in ax.transData.transform(dots.get_offsets()):
                assert not legend.contains(x, y)
        assert ax.get_ylabel() == "percent (one seed)"
        whiskers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert not whiskers  # one seed: no SE, no whisker drawn as a flat cap


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._in = False

    def handle_starttag(self, tag: str, attrs) -> None:  # noqa: ANN001
        self._in = tag in ("td", "th")

    def handle_data(self, data: str) -> None:
        if self._in:
            self.cells.append(data)


def test_results_print_short_and_render_as_html(frame, one_seed) -> None:
    result = cdscope.bshared(frame)
    text = repr(result)
    assert len(text.splitlines()) <= 8  # not the ~60 lines of a dataclass repr
    summary = result.summary.set_index(["model", "measure"])
    shown = f"{100 * summary.loc[('tuned', 'B_shared_C'), 'mean']:.2f}"
    delta = result.paired.set_index("measure").loc["B_shared_C"]
    assert shown in text and f"{100 * delta['mean']:+.2f}" in text
    assert "B_shared_C_unbiased" in text and ".per_seed (" in text
    parser = _Cells()
    parser.feed(result._repr_html_())
    assert any(c.startswith(f"{shown} ± ") for c in parser.cells) and "ref" in parser.cells
    assert "n/a" in repr(one_seed)  # one seed: no SE, said so
    ref = cdscope.random_reference(3, 6, trials=300, value=0.5)
    assert f"percentile {ref.stats['percentile']:.1f}" in repr(ref)
    assert "<table" in ref._repr_html_()


def test_eap_heatmap_labels_every_layer() -> None:
    from cdscope.core.eap_graph import EdgeGraph
    from cdscope.output.plots_eap import layer_ticks

    graph = EdgeGraph.from_layers(30)
    ticks, labels, bounds = layer_ticks(list(graph.upstream))
    assert labels == ["emb", *[str(i) for i in range(30)]]
    assert ticks[:3] == [0, 1.5, 3.5] and len(bounds) == 30  # emb, then attn/mlp row pairs
    ticks, labels, bounds = layer_ticks([node for node, _ in graph.consumers])
    assert labels == [*[str(i) for i in range(30)], "logits"]
    assert ticks[0] == 1.5 and ticks[-1] == 4 * 30  # q, k, v, in per layer; then the logits
