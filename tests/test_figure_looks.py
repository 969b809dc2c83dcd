"""What the figures say of themselves: one colour table of paths (a hue per family, the same look in every figure),
host wall time on a CPU run, noisy points drawn apart, no line through a panel of one x value, and the heatmap's
step named in each panel."""

import colorsys
from pathlib import Path

import matplotlib.colors as mcolors
import pytest
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D

from swabench.analysis import derived
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish import limits, marks, plots, style, tree_plots

ROOT = Path(__file__).resolve().parents[1]
H200_RUN = ROOT / "tests" / "fixtures" / "h200-run"
DEFAULT_RUN = ROOT / "tests" / "fixtures" / "published" / "results" / "h200-default-0.7.4"
TREE_RUN = ROOT / "results" / "h200-tree-0.7.4"  # the runs plots/RUN/tree_cost.png and decode.png are made from
SERVING_RUN = ROOT / "results" / "h200-serving-0.7.4"


@pytest.fixture(scope="module")
def h200():
    return derived.load(H200_RUN)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    style.pyplot().close("all")


def hue(colour: str) -> float | None:
    """A colour's hue to two places (a shade's rounding moves it by less), None for a grey."""
    h, _, s = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
    return None if s < 0.05 else round(h * 50) / 50


def path_colours(fig) -> dict[str, set[str]]:
    """Each path a figure draws (by its artists' labels) and the colours it is drawn in."""
    seen: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.lines:
            impl = line.get_label().split(" [")[0]
            if registry.known(impl):
                seen.setdefault(impl, set()).add(mcolors.to_hex(line.get_color()))
    return seen


def test_the_colour_table_gives_each_path_one_look_in_its_familys_hue():
    names = registry.names()
    looks = {name: style.look(name) for name in names}
    assert len({(lk["color"], lk["marker"]) for lk in looks.values()}) == len(names), "two paths share a look"
    for name, lk in looks.items():
        assert style.look(name) == lk  # asked again, the same
        assert hue(lk["color"]) == hue(style.FAMILY_HUES[style.family(name)]), name
    families = {style.family(n) for n in names}
    assert {"prefill", "decode"} <= families
    hues = [hue(style.FAMILY_HUES[f]) for f in families]
    assert len(set(hues)) == len(hues), "two families share a hue"
    # the decode figure's 19 legend entries had paged-window and decode-trim in one colour
    assert hue(style.look("paged-window")["color"]) != hue(style.look("decode-trim")["color"])
    assert style.family("decode-tc-trim") == "decode" and style.family("xqa-window") == "shelf"


def test_a_path_has_the_same_colour_in_two_figures(h200):
    table, meta = h200
    window = path_colours(plots.time_vs_window(table, meta))
    speculative = path_colours(plots.speculative(table, meta))
    shared = set(window) & set(speculative)
    assert "paged-window" in shared
    for impl in shared:
        assert window[impl] == speculative[impl] == {mcolors.to_hex(style.look(impl)["color"])}, impl


def test_the_decode_legend_names_each_path_once_and_keys_backends_and_pages_apart():
    table, meta = derived.load(SERVING_RUN)
    fig = plots.decode(table, meta)
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    paths = [t for t in texts if registry.known(t)]
    assert len(paths) == len(set(paths)) == 6 and not any("[" in t for t in texts)  # 19 path [backend] pages before
    assert "fa3" in texts and "auto" in texts and "page size 1 (hollow)" in texts and len(texts) < 16


def cpu(meta: dict) -> dict:
    """The same run as if it had been timed on the CPU: no GPU named, no peaks."""
    return {**meta, "gpu": None, "device": "cpu", "peaks": None}


def axis_labels(fig) -> list[str]:
    return [ax.get_xlabel() for ax in fig.axes] + [ax.get_ylabel() for ax in fig.axes]


@pytest.mark.parametrize("name", ["time_vs_window", "decode", "speculative", "plan_vs_kernel", "backends"])
def test_a_cpu_runs_figures_say_host_wall_time(h200, name):
    table, meta = h200
    on_gpu, on_cpu = plots.FIGURES[name](table, meta), plots.FIGURES[name](table, cpu(meta))
    words = [t.get_text() for t in on_cpu.findobj(lambda a: hasattr(a, "get_text"))]
    assert not any("kernel time" in w for w in words), [w for w in words if "kernel time" in w]
    assert "host wall time (us)" in axis_labels(on_cpu) and "kernel time (us)" in axis_labels(on_gpu)


def test_the_rate_figure_draws_a_ceiling_and_its_caption_names_one_only_where_the_run_has_the_gpus_peaks(h200):
    doc = " ".join(limits.rate_vs_context.__doc__.split())
    assert "On a run that measured the GPU's peaks, its ceiling is drawn" in doc and doc.count("ceiling") == 1
    table, meta = h200
    for run, drawn in ((meta, True), (cpu(meta), False)):
        lines = [line.get_label() for ax in limits.rate_vs_context(table, run).axes for line in ax.lines]
        assert any(label.startswith("ceiling") for label in lines) is drawn


def rings(fig) -> list[tuple[float, float]]:
    return [tuple(p) for ax in fig.axes for c in ax.collections if c.get_label() == marks.NOISY
            for p in c.get_offsets()]


def test_noisy_points_are_ringed_and_the_legend_says_so(h200):
    table, meta = h200
    table = table.copy()
    pick = (table["impl"] == "paged-window") & (table["backend"] == "fa2") & (table["mode"] == "verify") \
        & (table["status"] == "pass") & (table["sliding_window"] == 1024)
    victim = table.index[pick][0]
    assert rings(plots.plan_vs_kernel(table, meta)) == []  # the fixture's points are all below the bar
    table.loc[victim, "noise"] = marks.NOISE * 3
    scatter = plots.plan_vs_kernel(table, meta)
    assert rings(scatter) == [(table.loc[victim, "median_us"], table.loc[victim, "plan_us"])]
    lines = plots.time_vs_window(table, meta)
    verify = [ax for ax in lines.axes if ax.get_title() == "verify, paged"][0]
    ringed = [tuple(p) for c in verify.collections if c.get_label() == marks.NOISY for p in c.get_offsets()]
    assert [x for x, _ in ringed] == [1024]  # the line's point at that window, no other
    legend = [t.get_text() for legend in lines.legends for t in legend.get_texts()]
    assert marks.NOISY in legend and "above 2%" in marks.NOISY


def test_a_panel_of_one_x_value_is_bars_not_a_line():
    import pandas as pd

    ax = style.pyplot().figure().add_subplot()
    points = pd.DataFrame({"y": [5.0], "noisy": [True]}, index=[16])
    series = [marks.Series("paged-window", "paged-window [fa2]", points),
              marks.Series("paged-trim", "paged-trim [fa2]", points.assign(y=7.0), hollow=True)]
    assert marks.draw(ax, series, "draft tokens") is True
    assert not ax.lines and len(ax.patches) == 2 and ax.get_xlabel() == "draft tokens: 16"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["paged-window [fa2]", "paged-trim [fa2]"]
    assert mcolors.to_hex(ax.patches[1].get_facecolor()) == "#ffffff"  # hollow
    assert len(ax.collections[0].get_offsets()) == 1  # each noisy bar ringed
    two = style.pyplot().figure().add_subplot()
    assert marks.draw(two, [marks.Series("paged-window", "a", pd.concat([points, points.rename(index={16: 64})]))],
                      "draft tokens") is False and len(two.lines) == 1


def test_the_tree_figure_draws_a_one_size_layer_as_bars_with_titles_that_tell_layers_apart():
    fig = tree_plots.tree_cost(*derived.load(TREE_RUN))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(set(titles)) == len(titles)
    assert "gpt-oss-20b with sinks, window_left 127" in titles and "gpt-oss-20b without sinks, window_left 127" in titles
    plain = fig.axes[titles.index("gpt-oss-20b without sinks, window_left 127")]
    assert any(isinstance(c, BarContainer) for c in plain.containers)
    assert not [line for line in plain.lines if registry.known(line.get_label().split(" (")[0])]
    assert plain.get_xlabel() == "draft tokens (nodes): 16"
    sinks = fig.axes[titles.index("gpt-oss-20b with sinks, window_left 127")]
    assert all(isinstance(line, Line2D) for line in sinks.lines) and len(sinks.lines) >= 2


def test_the_heatmap_names_the_step_of_each_panel_and_holds_window_128():
    table, meta = derived.load(DEFAULT_RUN)
    fig = plots.FIGURES["speedup_heatmap"](table, meta)
    panels = [ax for ax in fig.axes if ax.get_title()]
    steps = [m for m in MODES if m in set(table["mode"])]
    assert [ax.get_title() for ax in panels[:len(steps)]] == [f"{m}, page size 16" for m in steps]
    assert [ax.get_title() for ax in panels[len(steps):]] == ["verify, by page size (2 shapes timed at each)"]
    extend = panels[0]
    assert "128" in [t.get_text() for t in extend.get_yticklabels()]
    cells = {t.get_text() for t in extend.texts}
    t = table[(table["impl"] == "paged-window") & (table["mode"] == "extend") & (table["sliding_window"] == 128)
              & (table["backend"] == "fa2") & (table["page_size"] == 16) & (table["status"] == "pass")]
    assert f"{t['speedup_vs_mask'].median():.0f}x" in cells  # the speed page's headline cell, to two figures


def test_a_case_without_a_place_on_a_figures_axis_is_left_out_and_an_empty_figure_is_not_made(tmp_path):
    """Chunked cases (no window) on the window axis drew a tick at -1 on a log axis; decode steps whose requests
    each have their own context drew an empty panel."""
    models = derived.load(ROOT / "results" / "h200-models-0.7.4")
    ticks = [t.get_text() for ax in plots.time_vs_window(*models).axes for t in ax.get_xticklabels()]
    assert "128" in ticks and "-1" not in ticks
    replay = derived.load(ROOT / "results" / "h200-replay-imported-0.7.4")
    assert replay[0].loc[replay[0]["mode"] == "decode", "prefix_len"].isna().all()
    assert plots.decode(*replay) is None
    empty = style.pyplot().figure()
    empty.add_subplot()
    assert not plots.draws_anything(empty) and plots.draws_anything(plots.speculative(*replay))
    labels = [t.get_text() for t in plots.speculative(*replay).axes[0].get_xticklabels()]
    assert labels == ["4", "8"]  # draft tokens, not 4.0


def test_a_long_caption_wraps_inside_the_figure():
    """A run of many libraries with long build names gives a caption longer than the figure is wide: wrapped, it
    stays inside, so the saved PNG is not widened around panels left adrift in white space."""
    from swabench.publish import style

    meta = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "swabench": "0.1.0", "scenario": "backends",
            "libraries": {f"library-{i}": f"0.{i}.0 (a build for torch 2.11.0 and CUDA 13, from engine {i}'s wheel)"
                          for i in range(6)}}
    fig, _ = style.figure(meta, "a title", 1, 2, size=(3.4, 3.6))
    fig.canvas.draw()
    text = fig.texts[-1]
    assert "\n" in text.get_text()
    assert text.get_window_extent().width <= fig.bbox.width
    style.pyplot().close(fig)
