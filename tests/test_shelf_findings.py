"""The findings' shelf section: each family's fastest correct path against the existing wrappers on the same cases,
the conventions caught, bytes from a counted run of the same scenario, and the answers' step table picking it up."""

from pathlib import Path

import pandas as pd

from swabench.analysis import derived
from swabench.core.cases import MODES
from swabench.publish import sections
from swabench.publish.sections import answers, shelf
from swabench.publish.sections.base import FLOOR, Run

PUBLISHED = Path(__file__).resolve().parent / "fixtures" / "published" / "results" / "h200-default-0.7.4"
META = {"scenario": "shelf", "gpu": "NVIDIA H200", "libraries": {"flashinfer": "0.7.4"}}
COLUMNS = ["case_id", "impl", "backend", "kind", "mode", "status", "median_us", "pct_of_floor", "reason",
           "attention_chunk", "block", "causal", "library"]


def table(rows) -> pd.DataFrame:
    t = pd.DataFrame(rows, columns=COLUMNS[:8])
    return t.assign(reason="", attention_chunk=0, block=[8 if c == "c3" else 0 for c in t["case_id"]], causal=True,
                    library="flashinfer", storage="paged")


SHELF_RUN = table([
    ("c1", "decode-tc-trim", "fa2", "correct", "decode", "pass", 10.0, 40.0),
    ("c1", "xqa-window", "xqa", "correct", "decode", "pass", 8.0, 50.0),
    ("c1", "xqa-window-off-by-one", "xqa", "known-bug", "decode", "xfail", None, None),
    ("c1", "batch-attention-trim", "fa2", "known-bug", "decode", "xfail", None, None),
    ("c2", "batch-attention-trim", "fa2", "known-bug", "decode", "pass", 40.0, 15.0),  # exact there: timed
    ("c2", "decode-tc-trim", "fa2", "correct", "decode", "pass", 20.0, 30.0),
    ("c2", "decode-trim", "fa2", "correct", "decode", "pass", 30.0, 20.0),
    ("c2", "xqa-window", "xqa", "correct", "decode", "pass", 22.0, 28.0),
    ("c2", "xqa-window-off-by-one", "xqa", "known-bug", "decode", "xpass", None, None),
    ("c3", "paged-mask", "fa2", "correct", "verify", "pass", 10.0, 10.0),
    ("c3", "ranges-window", "fa2", "correct", "verify", "pass", 5.0, 20.0),
    ("c4", "paged-trim", "fa2", "correct", "verify", "pass", 12.0, 25.0),
    ("c4", "fmha-v2-window", "fmha-v2", "correct", "verify", "skip", None, None),
])


def test_each_family_is_held_to_the_best_existing_path_on_the_same_cases():
    t = shelf.families_table(Run("shelf-run", SHELF_RUN, META)).set_index(["step", "family"])
    xqa = t.loc[("decode", "xqa")]
    assert xqa["fastest correct path"] == "`xqa-window [xqa]`" and xqa["cases"] == 2
    assert xqa[shelf.VS_EXISTING] == "0.95"  # the median of 8 / 10 and 22 / 20
    assert xqa[FLOOR] == "39%" and xqa["statuses"] == "pass 2, xfail 1, xpass 1"
    holistic = t.loc[("decode", "holistic")]  # a known mistake timed where its semantics make it exact
    assert holistic["fastest correct path"] == "`batch-attention-trim [fa2]`" and holistic[shelf.VS_EXISTING] == "2.00"
    assert holistic["cases"] == 1 and holistic["statuses"] == "pass 1, xfail 1"
    assert t.loc[("decode", "decode (existing)"), "fastest correct path"] == "`decode-tc-trim [fa2]`"
    assert t.loc[("verify blocks", "ranges"), shelf.VS_EXISTING] == "0.50"
    assert t.loc[("verify", "fmha-v2"), "fastest correct path"].startswith("skips")
    steps = list(dict.fromkeys(t.index.get_level_values("step")))
    assert steps == sorted(steps, key=lambda s: (MODES.index(s.split()[0]), s))  # as a server meets them


def test_the_conventions_say_where_they_were_caught_and_where_they_are_exact():
    said = shelf.conventions_said(Run("shelf-run", SHELF_RUN, META))[0]
    assert "`xqa-window-off-by-one`, decode: caught on 1 of 2 points, NOT caught on 1 (" in said
    assert "`batch-attention-trim`, decode: caught on 1 of 2 points, right on 1 where its semantics make it exact (" \
        in said


def test_a_run_without_the_shelf_has_no_section_and_no_column_in_the_answers():
    plain = Run("default-run", SHELF_RUN[SHELF_RUN["impl"].isin(["decode-tc-trim", "decode-trim"])], META)
    assert shelf.families_table(plain).empty and shelf.in_words(shelf.shelf_pick([plain], "decode")) == ""
    assert shelf.across([plain]) == []


def test_bytes_come_from_a_counted_run_of_the_same_scenario_and_release():
    counted = SHELF_RUN[SHELF_RUN["status"] == "pass"].assign(dram_read_bytes=1e6, read_amplification=1.5)
    counted.loc[counted["impl"] == "xqa-window", "read_amplification"] = 1.02
    other = dict(META, libraries={"flashinfer": "0.7.2.post1"})
    runs = [Run("shelf-run", SHELF_RUN, META), Run("ncu-072", counted.assign(read_amplification=9.0),
                                                   dict(other, counters={})),
            Run("ncu", counted, dict(META, counters={}))]
    t = shelf.families_table(shelf.with_counted_bytes(runs[0], runs)).set_index(["step", "family"])
    assert t.loc[("decode", "xqa"), "DRAM read / needed"] == "1.02x"
    assert shelf.families_table(runs[0]).set_index(["step", "family"]).loc[("decode", "xqa"), "DRAM read / needed"] == ""
    body = shelf.across(runs)
    assert body[-2] == "From `shelf-run`:" and "1.02x" in body[-1] and "9.00x" not in body[-1]


def test_xqa_s_counted_reads_are_held_to_its_tile_rule():
    """Two decode points of a counted run: K and V of 129 and 383 tokens a KV head (bfloat16, 8 heads of 64), read
    2% over the first and exactly at the second."""
    rows = pd.DataFrame({"case_id": ["a", "b", "c"], "impl": ["xqa-window", "xqa-window", "sink-decode"],
                         "backend": ["xqa", "xqa", "fa2"], "mode": "decode", "status": "pass", "length_dist": None,
                         "prefix_len": [16256, 16510, 16510], "window_left": 127, "batch_size": 32,
                         "num_kv_heads": 8, "head_dim": 64, "dtype": "bfloat16", "kv_dtype": None,
                         "dram_read_bytes": [1.02 * 129 * 2 * 32 * 8 * 64 * 2, 383 * 2 * 32 * 8 * 64 * 2, 1.0],
                         "read_amplification": [1.01, 2.64, 1.0]})
    said = shelf.xqa_tiles_said(Run("ncu", rows, dict(META, counters={})))
    assert said == ["XQA's decode reads against its 256-token tile rule (docs/shelf.md): DRAM read / the rule's K and "
                    "V 1.00-1.02x over 2 points, at contexts 16257, 16511 and windows 128, where the read / needed is "
                    "1.01-2.64x (`ncu`)."]
    assert shelf.xqa_tiles_said(Run("ncu", rows[rows["impl"] != "xqa-window"], META)) == []


def test_the_answers_step_table_names_the_shelf_s_best_path():
    run = Run("shelf-run", SHELF_RUN, META)
    assert shelf.in_words(shelf.shelf_pick([run], "decode")) == "`xqa-window [xqa]` 0.95x over 2 points (`shelf-run`)"
    default = Run("default", *derived.load(PUBLISHED))
    assert answers.SHELF_COLUMN not in answers.per_step([default])
    steps = answers.per_step([default, run]).set_index("step")
    assert steps.loc["decode", answers.SHELF_COLUMN] == "`xqa-window [xqa]` 0.95x over 2 points"
    assert steps.attrs["shelf_run"] == "`shelf-run`"  # one run speaks for the column: named once, above it
    assert steps.loc["extend", answers.SHELF_COLUMN] == ""  # the shelf run has no extend step
    section = shelf.SECTIONS[0].for_runs([run])
    assert section[0] == "## FlashInfer's Hopper shelf" and section[-2] == "From `shelf-run`:"
    assert shelf in sections.TOPICS  # a page of its own under findings/


def test_the_run_that_speaks_for_most_steps_is_named_once_and_another_in_its_cell():
    extend = table([("c6", "paged-window", "fa2", "correct", "extend", "pass", 10.0, 30.0),
                    ("c6", "fmha-v2-window", "fmha-v2", "correct", "extend", "pass", 9.0, 33.0)])
    verify = table([("c7", "paged-trim", "fa2", "correct", "verify", "pass", 10.0, 30.0),
                    ("c7", "xqa-window", "xqa", "correct", "verify", "pass", 12.0, 25.0)])
    runs = [Run("default", *derived.load(PUBLISHED)), Run("shelf-run", pd.concat([SHELF_RUN, extend]), META),
            Run("models-run", verify, META)]
    steps = answers.per_step(runs).set_index("step")
    assert steps.attrs["shelf_run"] == "`shelf-run`"
    assert steps.loc["extend", answers.SHELF_COLUMN] == "`fmha-v2-window [fmha-v2]` 0.90x over 1 point"
    assert steps.loc["verify", answers.SHELF_COLUMN] == "`xqa-window [xqa]` 1.20x over 1 point (`models-run`)"


def test_a_release_set_s_folders_that_differ_by_release_alone_are_named_once():
    from swabench.publish.sections.releases import folders_named

    assert folders_named(["r/h200-release-0.7.2.post1", "r/h200-release-0.7.4"], ["0.7.2.post1", "0.7.4"]) == \
        "`r/h200-release-{0.7.2.post1,0.7.4}`"
    assert folders_named(["r/h200-default-run3", "r/h200-default-0.7.4"], ["0.7.2.post1", "0.7.4"]) == \
        "`r/h200-default-run3`, `r/h200-default-0.7.4`"


def test_a_shelf_path_timed_on_too_few_cases_does_not_speak_for_the_step():
    few = SHELF_RUN[~((SHELF_RUN["impl"] == "xqa-window") & (SHELF_RUN["case_id"] == "c2"))]
    more = pd.concat([few, few.assign(case_id=few["case_id"] + "b")])
    more = more[~((more["impl"] == "xqa-window") & (more["case_id"] == "c1b"))]  # xqa times 1 of 4 cases
    # XQA is faster where it ran, but on 1 of the 4 cases the wrappers timed: BatchAttention's 2 of 4 speak instead
    assert shelf.in_words(shelf.shelf_pick([Run("few", more, META)], "decode")) == \
        "`batch-attention-trim [fa2]` 2.00x over 2 points (`few`)"


def test_steps_no_shelf_family_ran_are_left_out():
    t = shelf.families_table(Run("shelf-run", SHELF_RUN, META))
    plain = SHELF_RUN.assign(case_id=SHELF_RUN["case_id"] + "x", mode="extend")
    plain = plain[plain["impl"].isin(["paged-trim", "paged-mask"])]
    both = shelf.families_table(Run("both", pd.concat([SHELF_RUN, plain]), META))
    assert "extend" not in set(both["step"]) and len(both) == len(t)


def test_a_block_step_meets_the_plain_wrappers_planned_non_causal_on_its_twin():
    """One block of all 16 queries, inside a window of 127: causal=False sees the same keys, so paged-window
    planned that way competes on the block step; a block of 8 has no such twin."""
    shape = dict(mode="verify", model="m", batch_size=4, prefix_len=300, window_left=127, page_size=16,
                 num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", sinks=False, qo_len=16,
                 library="flashinfer", reason="", attention_chunk=0, pct_of_floor=10.0, kind="correct",
                 status="pass", backend="fa2")
    rows = [dict(shape, case_id="b16", impl="ranges-window", block=16, causal=True, median_us=6.0),
            dict(shape, case_id="b16", impl="paged-mask", block=16, causal=True, median_us=12.0),
            dict(shape, case_id="b8", impl="ranges-window", block=8, causal=True, median_us=6.0),
            dict(shape, case_id="b8", impl="paged-mask", block=8, causal=True, median_us=12.0),
            dict(shape, case_id="nc", impl="paged-window", block=0, causal=False, median_us=4.0)]
    t = shelf.families_table(Run("blocks", pd.DataFrame(rows), META)).set_index(["step", "family"])
    ranges = t.loc[("verify blocks", "ranges")]
    assert ranges[shelf.VS_EXISTING] == "1.00"  # the median of 6 / 4 on b16 (against the twin) and 6 / 12 on b8
    assert t.loc[("verify blocks", "prefill (existing)"), "fastest correct path"] == \
        "`paged-window [fa2] (causal=False)`"
    assert "verify non-causal" not in set(t.index.get_level_values("step"))
