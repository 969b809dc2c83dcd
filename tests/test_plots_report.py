"""Figures and the report, made from a committed H200 run folder and from a CPU run."""

import functools
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from swabench.publish.sections import Run, speed
from swabench.analysis import derived, versus
from swabench.impls import registry
from swabench.publish import plots, report

# seven whole cases of the published results/h200x2-default-2gpu run (default.toml with peers), cut by
# fixtures/make_h200_run.py so that every figure keeps the panels it has on the whole run
H200_RUN = Path(__file__).resolve().parent / "fixtures" / "h200-run"
PANELS = {"time_vs_window": 8, "speedup_by_mode": 1, "peers": 1, "speedup_heatmap": 6, "speculative": 2,
          "rate_vs_context": 4, "backends": 5, "decode": 1, "plan_vs_kernel": 1, "roofline": 1}
# heatmap: a panel per step (4), one for the step timed at several page sizes, and the colour bar


@pytest.fixture(scope="module")
def h200():
    return derived.load(H200_RUN)


@pytest.fixture(scope="module")
def drawn(h200):
    """Each figure of the H200 fixture, drawn once for the tests that read it (none draws on it or saves it)."""
    return functools.cache(lambda name: plots.FIGURES[name](*h200))


@pytest.mark.parametrize("name", list(PANELS))
def test_each_figure_has_its_panels_and_a_caption(drawn, name):
    fig = drawn(name)
    assert len(fig.axes) == PANELS[name]
    texts = [t.get_text() for t in fig.texts]
    assert any("NVIDIA H200" in t and "flashinfer 0.7.2.post1" in t for t in texts)
    assert sum(len(ax.lines) + len(ax.collections) + len(ax.patches) + len(ax.images) for ax in fig.axes) > 0


@pytest.mark.slow
def test_the_report_has_its_tables_and_every_figure_as_a_real_image(h200, tmp_path):
    """The report of the H200 fixture with every figure: drawn once, for its text and its images."""
    from swabench.publish.style import save

    reported = report.write(H200_RUN, tmp_path / "report")
    text = reported.read_text()
    assert "| impl | kind | backend | pass | fail | xfail | xpass | skip |" in text
    assert "| paged-trim-causal | known-bug | fa2 | 0 | 0 | 3 | 0 | 0 |" in text  # 12 | 0 | 120 on the whole run
    assert "## Headline: speedup over the custom-mask path" in text and "| verify | 1024 |" in text
    for name in PANELS:
        assert f"![{name}]({name}.png)" in text and (reported.parent / f"{name}.png").exists()
    folder = reported.parent
    made = {name: folder / f"{name}.png" for name in plots.FIGURES if (folder / f"{name}.png").exists()}
    # no chunked layer, no counters, no plain wrappers, no cuDNN or FA4 in the run
    assert set(plots.FIGURES) - set(made) == {"sawtooth", "bytes_read", "wrapper_modes", "tree_cost", "which_backend"}
    for name, path in made.items():
        image = mpimg.imread(path)
        assert image.shape[0] > 300 and 1000 <= image.shape[1] <= 1700, name
        assert image[..., :3].std() > 0.05, f"{name} is blank"
        assert path.stat().st_size < 500_000, name
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(p.name for p in made.values())
    again = save(plots.FIGURES["decode"](*h200), tmp_path, "decode")[0]  # nothing in a PNG changes from run to run
    assert again.read_bytes() == made["decode"].read_bytes(), "decode: the same run gave other bytes"


def test_failed_and_skipped_points_are_drawn_not_dropped(h200):
    table, meta = h200
    table = table.copy()
    victim = table.index[(table["impl"] == "paged-window") & (table["mode"] == "verify") & (table["backend"] == "fa2")][0]
    table.loc[victim, "status"] = "fail"
    fig = plots.time_vs_window(table, meta)
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "failed gate" in labels and "skipped" in labels
    crosses = [c for ax in fig.axes for c in ax.collections if c.get_label() == "failed gate"]
    assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 1  # one panel, one point


def test_headline_is_computed_from_the_table(h200):
    table, _ = h200
    head = speed.headline(Run("x", table, {}))
    cell = head[(head["mode"] == "verify") & (head["window (keys)"] == "1024")]["paged-window"].iloc[0]
    expect = table[(table["impl"] == "paged-window") & (table["backend"] == "fa2") & (table["mode"] == "verify")
                   & (table["sliding_window"] == 1024)]["speedup_vs_mask"]
    assert cell == f"{expect.median():.1f}x ({expect.count()})"


def test_versus_reference_divides_by_fa2_window_path_on_the_same_case(h200):
    table, _ = h200
    per_point = versus.against_reference(table)
    flex = per_point[(per_point["impl"] == "flex-flat") & (per_point["storage"] == "ragged")].iloc[0]
    fa2 = table[(table["case_id"] == flex["case_id"]) & (table["impl"] == "ragged-window") & (table["backend"] == "fa2")]
    assert flex["ratio"] == pytest.approx(flex["median_us"] / fa2["median_us"].iloc[0])
    window_paths = {"paged": "paged-window", "ragged": "ragged-window"}
    assert not ((per_point["impl"] == per_point["storage"].map(window_paths)) & (per_point["backend"] == "fa2")).any()
    summary = speed.against_reference_long(table)
    row = summary[(summary["impl"] == "flex-flat") & (summary["mode"] == "decode")]
    assert len(row) and (row["faster in"].str.startswith("0/")).all()  # flex never beat fa2 on decode here
    assert not summary["impl"].isin(["paged-mask", "ragged-mask"]).any()


def test_roles_come_from_the_registry():
    from swabench.impls import registry
    assert registry.reference_path("paged") == ("paged-window", "fa2")
    assert registry.reference_path("ragged") == ("ragged-window", "fa2")
    assert registry.baseline_for("flashinfer", "paged") == "paged-mask"
    assert registry.baseline_for("torch", "ragged") == "torch-mask"
    assert registry.baseline_for("flex", "paged") == "paged-mask"  # a peer without a naive path of its own


@pytest.mark.slow
def test_registration_order_does_not_hang_on_which_module_was_imported_first():
    import subprocess
    import sys
    code = ("from swabench.impls import embedded\nfrom swabench.impls import registry\n"
            "print(registry.names()[0], registry.baseline_for('flex', 'paged'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["paged-window", "paged-mask"]


@pytest.mark.slow
def test_cpu_run_plots_without_the_gpu_only_figures(tmp_path):
    from click.testing import CliRunner

    from swabench import cli
    scenario = tmp_path / "s.toml"
    scenario.write_text('implementations = ["torch-trim", "torch-mask"]\n[fixed]\nhead_dim = 64\nnum_qo_heads = 4\n'
                        '[[sweep]]\nmode = "verify"\ndraft_tokens = 4\nprefix_len = 64\nwindow_left = [7, 31]\n')
    runner = CliRunner()
    assert runner.invoke(cli.main, ["run", str(scenario), "--out", str(tmp_path / "run"), "--device", "cpu"]).exit_code == 0
    r = runner.invoke(cli.main, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "backends: no points for it in this run" in text and "![time_vs_window]" in text


@pytest.mark.slow
def test_bench_host_saves_json_and_plots(tmp_path):
    from conftest import invoke

    out = tmp_path / "hb"
    done = invoke("bench-host", "--quick", "--out", out)  # its benchmarks run in a pytest process of their own
    assert done.exit_code == 0, done.output
    import gzip
    import json
    data = json.load(gzip.open(out / "host_benchmarks.json.gz", "rt"))
    names = {b["name"].split("[")[0] for b in data["benchmarks"]}
    assert names == {"test_custom_mask_build_and_pack", "test_trimmed_page_table", "test_indptr_and_last_page_arrays"}
    assert all(len(b["stats"]["data"]) >= 1 for b in data["benchmarks"])
    assert mpimg.imread(out / "host_work.png").shape[0] > 200
    assert json.loads((out / "meta.json").read_text())["torch"]


def test_bench_host_without_pytest_benchmark_says_how_to_install_it_and_writes_nothing(tmp_path, monkeypatch):
    import importlib.util

    from conftest import invoke

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest_benchmark" else
                        found(name, *a))
    done = invoke("bench-host", "--quick", "--out", tmp_path / "hb")
    assert done.exit_code == 2 and "pytest-benchmark" in done.output and ".[test]" in done.output, done.output
    assert not (tmp_path / "hb").exists()


def test_tick_labels_keep_only_what_tells_cases_apart():
    from swabench.publish.plots import _differences
    labels = ["decode b32 p[32 of 1..9 sum 80] q1 W7 h8/2 [m]", "verify b32 p[32 of 1..9 sum 81] q4 W7 h8/2 [m]"]
    assert _differences(labels) == ["decode p[32 of 1..9 sum 80] q1", "verify p[32 of 1..9 sum 81] q4"]
    assert _differences(["same W7", "same W7"]) == ["same W7", "same W7"]  # nothing left: the whole label
    assert _differences(["decode b32 W127 sinks", "decode b32 W127"]) == ["sinks", "without sinks"]


@pytest.mark.parametrize("name", list(PANELS))
def test_each_path_looks_the_same_in_every_figure_and_legends_sit_outside(drawn, name):
    """A path's colour and marker are its own (style.look) in every figure, and no legend sits on a panel,
    where it would hide points or the title."""
    import matplotlib.colors as mcolors
    from matplotlib.container import BarContainer
    from matplotlib.patches import Rectangle

    from swabench.publish.style import look

    fig = drawn(name)
    assert all(ax.get_legend() is None for ax in fig.axes)
    drawn = 0
    for ax in fig.axes:
        bars = [(c.get_label(), c.lines[0]) for c in ax.containers if hasattr(c, "has_xerr")]
        bars += [(c.get_label(), c.patches[0]) for c in ax.containers if isinstance(c, BarContainer)]
        for label, artist in [(a.get_label(), a) for a in [*ax.lines, *ax.collections]] + bars:
            impl = label.split(" [")[0]
            if impl not in {i.name for i in registry.all_implementations()}:
                continue
            want = look(impl)
            if hasattr(artist, "get_marker"):
                colour, marker = artist.get_color(), artist.get_marker()
            elif isinstance(artist, Rectangle):  # a bar: its edge in the path's colour, hollow or not
                colour, marker = artist.get_edgecolor(), None
            else:
                colour, marker = artist.get_edgecolor()[0], None
            assert mcolors.to_hex(colour) == mcolors.to_hex(want["color"]), (name, label)
            assert marker in (None, want["marker"]), (name, label)
            drawn += 1
    assert drawn or name in ("speedup_heatmap", "backends")  # a colour per window or per backend there


def test_a_paths_backends_are_told_apart_by_fill():
    """One look per path; its fa2 points solid, fa3 hollow and auto pale, so three backends of one path do not
    read as one."""
    import matplotlib.colors as mcolors

    from swabench.publish import limits, style

    ax = style.pyplot().figure().add_subplot()
    for k, backend in enumerate(("fa2", "fa3", "auto")):
        limits._points(ax, None, [1.0], [1.0], "paged-window", backend, k)
    faces = [tuple(c.get_facecolor()[0]) if len(c.get_facecolor()) else None for c in ax.collections]
    edges = {mcolors.to_hex(c.get_edgecolor()[0]) for c in ax.collections}
    assert edges == {mcolors.to_hex(style.look("paged-window")["color"])}
    assert faces[1] is None or faces[1][3] == 0  # hollow
    solid, pale = mcolors.to_rgb(faces[0]), mcolors.to_rgb(faces[2])
    assert solid == pytest.approx(mcolors.to_rgb(style.look("paged-window")["color"]))
    assert all(p > s for p, s in zip(pale, solid) if s < 1) and faces[2][3] > 0  # lighter, not hollow
    style.pyplot().close("all")


def test_a_run_s_commit_is_cut_to_its_hash_and_keeps_its_label():
    from swabench.publish.markdown import short_commit

    assert short_commit({"git_commit": "fad47f9c0ffee1234567"}) == "fad47f9c0f"
    assert short_commit({"git_commit": "fad47f9c0ffee+brief"}, 8) == "fad47f9c+brief"
    assert short_commit({}) == "unknown"
