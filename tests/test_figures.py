"""Figures rendered on tiny data: whole numbers where an axis counts layers or heads, plain
numbers on log axes, points off the axis edges with a single width. (Labels are never cut off:
``plotting.save_figure`` saves every figure at its tight extent, ``bbox_inches="tight"``.)"""

import pytest

from hwh_jax import plotting


@pytest.fixture
def figures(monkeypatch, tmp_path):
    """The figures the plot functions save: (figure, its saved PNG's size) by file name."""
    saved = {}
    real = plotting.save_figure

    def keep(fig, path, *, dpi=120):
        fig.canvas.draw()
        saved[str(path).rsplit("/", 1)[-1]] = fig
        plt = plotting.pyplot()
        monkeypatch.setattr(plt, "close", lambda f: None)
        real(fig, path, dpi=dpi)

    for module in (
        "hwh_jax.eval.plots",
        "hwh_jax.analysis.plots",
        "hwh_jax.experiments.mqar.report",
    ):
        monkeypatch.setattr(f"{module}.save_figure", keep)
    monkeypatch.setattr("hwh_jax.plotting.save_figure", keep)
    return saved


def _whole(labels):
    values = [float(t.get_text().replace("\u2212", "-")) for t in labels if t.get_text()]
    return values and all(v == int(v) for v in values)


def test_each_figure_keeps_its_labels_and_counts_in_whole_numbers(figures, tmp_path):
    from hwh_jax.analysis import plots as aplots
    from hwh_jax.eval import plots as eplots
    from hwh_jax.experiments.mqar import report as mqar_report

    rows = [
        {"task": "niah_single_1", "length": n, "depth": d, "score": s}
        for n in (256, 512)
        for d, s in ((0, 100.0), (100, 0.0))
    ]
    eplots.niah_heatmap(rows, "niah_single_1", "tiny: niah_single_1", tmp_path / "niah.png", 256)
    ppl = [
        {"start": a, "end": a + 64, "ppl": p, "ppl_lo": p - 9, "ppl_hi": p + 10}
        for a, p in ((0, 175.0), (64, 168.0), (128, 160.0), (192, 181.0))
    ]
    eplots.ppl_chart({"hwh": ppl}, tmp_path / "ppl.png", 128)
    result = {"counts": [0, 1, 0], "layers": [{"heads": 3}, {"heads": 3}, {"heads": 0}]}
    aplots.retrieval_by_depth(result, tmp_path / "depth.png", "tiny")
    cells = [
        {"arch": a, "width": 64, "seq_len": 64, "pairs": 4, "mean": m, "accuracies": [m, m]}
        for a, m in (("gdn", 0.2), ("transformer", 0.9))
    ]
    mqar_report.figure(cells, tmp_path / "mqar.png")
    from hwh_jax.experiments.report import depth_figure

    by_depth = [
        {"length": n, "depth": d, "score": sc}
        for n in (256, 512)
        for d in (0, 50, 100)
        for sc in (100.0, 0.0, 100.0)
    ]
    depth_figure({"hwh": by_depth}, tmp_path / "niah_by_depth.png")
    assert set(figures) == {"niah.png", "ppl.png", "depth.png", "mqar.png", "niah_by_depth.png"}
    ax = figures["niah_by_depth.png"].axes[0]
    assert list(ax.lines[0].get_xdata()) == [0, 50, 100]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["hwh (512)"]
    depth = figures["depth.png"].axes[0]
    assert _whole(depth.get_xticklabels()) and _whole(depth.get_yticklabels())
    ppl_labels = [
        t.get_text()
        for t in figures["ppl.png"].axes[0].get_yticklabels(which="both")
        if t.get_text()
    ]
    assert ppl_labels and not any("times" in t or "^" in t for t in ppl_labels), ppl_labels
    assert len(figures["ppl.png"].axes[0].collections) == 1  # the interval's band
    mqar = figures["mqar.png"].axes[0]
    lo, hi = mqar.get_xlim()
    assert lo < 64 < hi and 64 / lo > 1.2 and hi / 64 > 1.2  # off the edges
    assert [t.get_text() for t in mqar.get_xticklabels()] == ["64"]
