"""CUDA-graph mode against plain wrappers: pairing a path with itself across modes, the fastest path per
mode, and what the findings page says of them (from tables made here, so every number is known)."""

import pandas as pd

from swabench.analysis import wrapper_modes
from swabench.inputs import axes
from swabench.publish.sections import Run, by_key, modes
from swabench.publish.sections.modes import in_short


def row(impl, backend, us, batch=48, wrapper_mode="cuda-graph", status="pass", plan=30.0):
    case = axes.make_case(dict(mode="decode", prefix_len=8192, batch_size=batch, window_left=127, head_dim=64,
                               num_qo_heads=64, num_kv_heads=8, wrapper_mode=wrapper_mode))
    return dict(case.axes(), case_id=case.case_id, case=case.label, impl=impl, backend=backend, kind="correct",
                status=status, median_us=us, plan_us=plan)


def table():
    return pd.DataFrame([
        row("decode-tc-trim", "fa2", 18.2), row("decode-tc-trim", "fa2", 14.2, wrapper_mode="plain"),
        row("decode-trim", "fa2", 19.0), row("decode-trim", "fa2", 13.0, wrapper_mode="plain"),
        row("decode-tc-trim", "fa2", 9.0, batch=1), row("decode-tc-trim", "fa2", 9.5, batch=1, wrapper_mode="plain"),
        row("decode-trim", "fa2", 10.0, batch=1), row("decode-trim", "fa2", 12.0, batch=1, wrapper_mode="plain"),
        row("paged-window", "fa2", 5.0, batch=16),  # a step timed one way only pairs with nothing
        row("torch-batch", "torch", 1.0),  # nor does a path without a plain mode, however fast
        row("decode-trim", "fa2", 1.0, batch=1, wrapper_mode="plain", status="fail")])


def test_each_path_pairs_with_itself_on_the_same_step():
    m = wrapper_modes.pairs(table()).set_index(["batch_size", "impl"])
    assert len(m) == 4 and 16 not in m.index.get_level_values(0)
    assert abs(m.loc[(48, "decode-tc-trim"), "cost_us"] - 4.0) < 1e-9
    assert abs(m.loc[(1, "decode-trim"), "cost"] - 10.0 / 12.0) < 1e-9  # a failed point is never the plain time


def test_the_fastest_path_per_mode_and_where_graph_mode_changes_it():
    f = wrapper_modes.fastest(table()).set_index("batch_size")
    assert f.loc[48, "graph_path"] == "decode-tc-trim [fa2]" and f.loc[48, "plain_path"] == "decode-trim [fa2]"
    assert f.loc[48, "changes"] and not f.loc[1, "changes"]
    said = in_short(Run("r", table(), {}))
    assert said[0].startswith("- decode fa2 +1.75 us (1.11x)") and len(said) == 1, said
    assert "on 1 of 2 steps, by up to 1.40x (`r`)." in said[0], said  # decode-tc-trim 18.2 us graph, decode-trim 13 plain


def test_the_section_shows_both_times_and_says_nothing_without_plain_points():
    section = by_key("wrapper-modes")
    shown = section.table(Run("r", table(), {}))
    assert len(shown) == 4 and set(shown["graph / plain"]) >= {"1.28", "1.46"}
    graph_only = table()[lambda t: t["wrapper_mode"] == "cuda-graph"]
    assert section.for_run(Run("r", graph_only, {})) == [] and in_short(Run("r", graph_only, {})) == []


def test_the_figure_draws_one_line_per_path_and_nothing_without_plain_points(tmp_path):
    from swabench.publish import plots
    from swabench.publish.style import save

    meta = {"gpu": "H200", "libraries": {"flashinfer": "0.7.4"}}
    with plots.quiet():
        fig = plots.wrapper_modes(table(), meta)
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert {"decode-tc-trim [fa2]", "decode-trim [fa2]"} <= labels and "paged-window [fa2]" not in labels
    assert save(fig, tmp_path, "wrapper_modes")[0].stat().st_size > 10_000
    assert plots.wrapper_modes(table()[lambda t: t["wrapper_mode"] == "cuda-graph"], meta) is None


def test_the_answers_speak_from_the_run_with_the_most_steps_built_both_ways():
    wide, narrow = Run("wide", table(), {}), Run("narrow", table()[lambda t: t["batch_size"] == 48], {})
    steps = len(wrapper_modes.fastest(wide.table))
    assert steps > len(wrapper_modes.fastest(narrow.table)) >= 1
    assert modes.widest([narrow, wide]) is wide and modes.widest([wide, narrow]) is wide
    assert modes.widest([Run("none", table()[lambda t: t["wrapper_mode"] == "cuda-graph"], {})]) is None
