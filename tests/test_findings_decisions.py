"""The decision table an engine builder reads first: the first table of the findings page, its columns in words, each
row naming its run folder; a runner-up within the points' noise is a tie; a ragged K/V path never stands as a paged
engine's answer; a kernel built for Hopper alone, and the shapes another path won, are named; and a range whose ends
read the same is said once."""

from itertools import takewhile
from pathlib import Path

import pandas as pd
import pytest

from swabench.analysis import decisions, derived
from swabench.publish import findings
from swabench.publish.sections import base, decisions as table_of, speed
from swabench.publish.sections.base import Run

H200_RUN = Path(__file__).resolve().parent / "fixtures" / "h200-run"  # a real run: every column of the format
META = {"scenario": "models", "gpu": "NVIDIA H200", "libraries": {"flashinfer": "0.7.4"}}


@pytest.fixture(scope="module")
def template() -> dict:
    return derived.load(H200_RUN)[0].iloc[0].to_dict()


def point(template, case, impl, backend, us, noise=0.002, storage="paged", mode="verify", batch=32, prefix=16384,
          page=16, status="pass", model="gemma-3-27b") -> dict:
    """One timed point of ``model`` as served (gemma-3-27b: no sinks, no soft-cap), on a shape of its own."""
    return {**template, "case_id": case, "case": case, "impl": impl, "backend": backend, "kind": "correct",
            "status": status, "median_us": us, "iqr_us": us * noise, "noise": noise, "storage": storage, "mode": mode,
            "model": model, "batch_size": batch, "prefix_len": prefix, "qo_len": 4,
            "page_size": page if storage == "paged" else float("nan"), "sinks": False, "logits_soft_cap": 0.0,
            "cache_fill": "random", "page_layout": "scattered" if storage == "paged" else None, "tree": None}


def run(template, name, rows, meta=META) -> Run:
    return Run(name, pd.DataFrame([point(template, *r[:4], **r[4]) if len(r) > 4 else point(template, *r)
                                   for r in rows]), meta)


def answers_of(*runs) -> list[decisions.Answer]:
    return decisions.decisions([(r.folder, r.table, r.meta) for r in runs])


def test_the_decision_table_is_the_first_table_of_the_findings_page_and_each_row_names_its_run(template):
    models = run(template, "runs/models", [("a", "paged-trim", "fa2", 100.0), ("a", "paged-window", "fa2", 120.0),
                                           ("b", "decode-tc-trim", "fa2", 50.0, {"mode": "decode"}),
                                           ("b", "xqa-window", "xqa", 60.0, {"mode": "decode"})])
    shapes = run(template, "runs/shapes", [(c, "paged-trim", "fa2", 10.0 * n, {"batch": n})
                                           for n, c in ((1, "c1"), (64, "c2"))]
                 + [(c, "paged-window", "fa3", 9.0 * n, {"batch": n}) for n, c in ((1, "c1"), (64, "c2"))])
    page = findings.pages([Run(str(H200_RUN), *derived.load(H200_RUN)), models, shapes])[""]
    lines = page.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert lines[0] == "# Findings" and first < 8  # the first screen, right under the title
    assert [line for line in lines[:first] if line.startswith("#")] == \
        ["# Findings", "## Which path to run: per model and step, on a paged KV cache"]
    header = [c.strip() for c in lines[first].strip("|").split("|")]
    assert header == ["model", "step", "KV cache", "fastest correct path", "its time (us)", "holds for",
                      "runner-up: its time / the fastest's", "does not hold", "GPU", "run"]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            for line in takewhile(lambda line: line.startswith("|"), lines[first + 2:])]
    assert [(r["step"], r["fastest correct path"], r["run"]) for r in rows] == [
        ("verify", "`paged-window` [fa3]", "`runs/shapes`"), ("decode", "`decode-tc-trim` [fa2]", "`runs/models`")]
    assert all(r["GPU"] == "H200" for r in rows)
    assert rows[0]["holds for"] == "batch 1/64, context 16k, page 16 (all 2 shapes)"  # the broadest run speaks
    assert "SM90 only (FA3): elsewhere `paged-trim` [fa2] 1.11x" in rows[0]["does not hold"]
    assert "fastest correct path" in page.split("\n## Answers\n")[1] and "mask / it" not in page


def test_a_runner_up_inside_the_noise_is_a_tie_and_one_outside_it_is_not(template):
    def runner(noise):
        t = run(template, "r", [("a", "paged-trim", "fa2", 100.0, {"noise": noise}),
                                ("a", "paged-window", "fa2", 100.3, {"noise": noise})])
        return answers_of(t)[0]

    tied, apart = runner(0.002), runner(0.001)  # 1.003 within 0.2% + 0.2%; not within 0.1% + 0.1%
    assert tied.tie and table_of.runner_words(tied) == "`paged-window` [fa2] 1.00x, a tie (noise 0.4%)"
    assert not apart.tie and table_of.runner_words(apart) == "`paged-window` [fa2] 1.003x"  # the digit that parts them
    assert decisions.within_noise(1.02, 0.02) and not decisions.within_noise(1.021, 0.02)


def test_a_path_within_the_noise_of_a_case_s_fastest_holds_that_shape(template):
    t = run(template, "r", [("a", "paged-trim", "fa2", 100.0, {"noise": 0.01}),
                            ("a", "paged-window", "fa2", 101.0, {"noise": 0.01}),
                            ("b", "paged-trim", "fa2", 100.0, {"batch": 64}),
                            ("b", "paged-window", "fa2", 120.0, {"batch": 64})])
    answer = answers_of(t)[0]
    assert answer.path == ("paged-trim", "fa2") and answer.held["case_id"].nunique() == 2
    assert table_of.not_held_words(answer) == ""  # held on every shape measured


def test_a_ragged_winner_never_stands_as_a_paged_engine_s_answer(template):
    ragged = {"storage": "ragged"}
    faster = run(template, "r", [("p", "paged-trim", "fa2", 100.0), ("p", "paged-window", "fa3", 110.0),
                                 ("q", "ragged-window", "fa3", 80.0, ragged)])
    said = answers_of(faster)
    assert [(a.storage, a.path) for a in said] == [("paged", ("paged-trim", "fa2")),
                                                   ("ragged", ("ragged-window", "fa3"))]
    assert table_of.row(said[1])["KV cache"] == "ragged: needs a ragged KV layout; 1.25x faster than paged"
    slower = run(template, "r", [("p", "paged-trim", "fa2", 100.0), ("q", "ragged-window", "fa3", 100.1, ragged)])
    assert [a.storage for a in answers_of(slower)] == ["paged"]  # not faster beyond the noise: no ragged row
    alone = run(template, "r", [("q", "ragged-window", "fa3", 80.0, ragged)])
    assert answers_of(alone) == []  # a ragged answer never stands alone


def test_the_shapes_another_path_won_are_named_with_their_run(template):
    broad = run(template, "runs/broad", [("a", "decode-tc-trim", "fa2", 10.0, {"mode": "decode", "batch": 64}),
                                         ("a", "xqa-window", "xqa", 12.0, {"mode": "decode", "batch": 64}),
                                         ("b", "decode-tc-trim", "fa2", 10.0, {"mode": "decode", "batch": 128}),
                                         ("b", "xqa-window", "xqa", 11.0, {"mode": "decode", "batch": 128}),
                                         ("c", "decode-tc-trim", "fa2", 10.0, {"mode": "decode", "batch": 1}),
                                         ("c", "xqa-window", "xqa", 8.0, {"mode": "decode", "batch": 1})])
    other = run(template, "runs/other", [("d", "decode-tc-trim", "fa2", 20.0, {"mode": "decode", "prefix": 4096}),
                                         ("d", "decode-trim", "fa2", 15.0, {"mode": "decode", "prefix": 4096})])
    answer = answers_of(broad, other)[0]
    assert answer.run == "runs/broad" and answer.path == ("decode-tc-trim", "fa2")
    assert table_of.held_words(answer) == "batch 64/128, context 16k, page 16 (2 of 3 shapes)"
    assert table_of.not_held_words(answer) == (
        "batch 1, context 16k, page 16: `xqa-window` [xqa] up to 1.25x faster; "
        "batch 32, context 4k, page 16: `decode-trim` [fa2] up to 1.33x faster (`runs/other`)")


def test_a_range_whose_ends_read_the_same_is_said_once():
    table, meta = derived.load(H200_RUN)
    extend = table[(table["mode"] == "extend") & (table["sliding_window"] == 1024)]  # one headline cell a path
    said = speed.headline_said(Run("runs/x", extend, meta))[0].splitlines()
    assert said and all(" to " not in line and "in every cell" not in line for line in said), said
    assert all(line.endswith("(extend, window 1024) faster than the custom mask (`runs/x`).") for line in said), said
    one = pd.DataFrame({"mode": ["extend"], "span": ["334"], "impl": ["paged-window"], "speedup_vs_mask": [2.1]})
    assert speed._against_mask(one) == "2.1x (extend, window 334) faster than the custom mask"
    two = pd.DataFrame({"mode": ["decode"] * 2, "span": ["128", "4096"], "impl": ["decode-window"] * 2,
                        "speedup_vs_mask": [0.71, 0.68]})
    assert speed._against_mask(two) == "0.7x, slower than the custom mask in every cell"
    assert base.span(pd.Series([1.001, 0.999])) == "1.00"
    assert base.spread(pd.Series([0.98, 0.981])) == "0.98x (each of 2)"
    assert base.ranged(pd.Series([5.0, 5.0])) == "5.00" and base.ranged(pd.Series([1.0, 2.0])) == "1.00-2.00"
