"""Trace replay: a JSON Lines trace becomes one case per distinct step, weighted by how often it
occurs; bad lines are refused by number; the replay's table is reported per 1000 steps of the mix."""

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import invoke, pages_text

from swabench.publish.sections import Run, serving
from swabench.analysis import derived, replay
from swabench.publish import report
from swabench.inputs import axes, traces

LAYER = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "sliding_window": 16, "page_size": 16}
STEPS = [{"mode": "decode", **LAYER, "requests": [[40, 1], [70, 1]]},
         {"mode": "decode", **LAYER, "requests": [[40, 1], [70, 1]], "count": 2},
         {"mode": "extend", **LAYER, "requests": [[0, 24], [30, 8]]},
         {"mode": "verify", "model": "gemma-3-1b", "requests": [[90, 4], [90, 4]]}]


def write(tmp_path, steps, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((s if isinstance(s, str) else json.dumps(s)) + "\n" for s in steps))
    return path


def test_distinct_steps_and_their_weights(tmp_path):
    steps = traces.read(write(tmp_path, STEPS))
    assert list(steps.values()) == [3, 1, 1]  # the two decode lines are one step, three times
    s = traces.scenario(tmp_path / "t.jsonl", steps, ["torch-trim"])
    assert s.name == "replay-t" and len(s.cases) == 3
    labels = [c.label for c in s.cases]
    assert "extend b2 p[0,30] q[24,8] W15" in labels[1] and "[gemma-3-1b]" in labels[2]
    weights = traces.weights(steps)
    assert sorted(weights.values()) == [1, 1, 3] and set(weights) == {c.case_id for c in s.cases}
    both = traces.scenario(tmp_path / "t.jsonl", steps, ["paged-window"])
    assert sorted({p.backend for p in both.points}) == ["fa2", "fa3"] and len(both.points) == 6
    assert {p.backend for p in traces.scenario(tmp_path / "t.jsonl", steps, ["paged-window"], ["fa3"]).points} \
        == {"fa3"}


def test_a_line_can_ask_for_the_models_plain_twin(tmp_path):
    line = {"mode": "decode", "model": "gpt-oss-120b", "requests": [[40, 1]]}
    steps = traces.read(write(tmp_path, [line, {**line, "model_features": False}]))
    s = traces.scenario(tmp_path / "t.jsonl", steps, ["torch-trim"])
    assert sorted(c.sinks for c in s.cases) == [False, True]


@pytest.mark.parametrize("line,message", [
    ("{not json", "line 1: not JSON"),
    ({"mode": "prefill", "requests": [[1, 1]]}, "line 1: mode: must be one of extend, verify, decode"),
    ({"mode": "decode", **LAYER, "requests": [[1, 2]]}, "line 1: requests: a decode step has one query"),
    ({"mode": "extend", **LAYER, "requests": []}, "line 1: requests: must be a non-empty list"),
    ({"mode": "extend", "requests": [[1, 2]]}, "line 1: give the layer"),
    ({"mode": "extend", **LAYER, "requests": [[1, 2]], "batch": 3}, "line 1: unknown key 'batch'"),
    ({"mode": "extend", **LAYER, "head_dim": 12, "requests": [[1, 2]]}, "line 1.head_dim: must be a positive multiple"),
    ({"mode": "extend", **LAYER, "requests": [[1, 2]], "count": 0}, "line 1: count: must be an integer from 1 to"),
])
def test_bad_lines_are_refused_by_number(tmp_path, line, message):
    with pytest.raises((traces.TraceError, axes.ScenarioError), match=message):
        traces.read(write(tmp_path, [line]))


def paths(rows, weights, modes=None):
    """A run table of (case_id, mode, impl, kind, library, backend, status, median_us) rows, weighed."""
    table = pd.DataFrame(rows, columns=["case_id", "mode", "impl", "kind", "library", "backend", "status",
                                        "median_us"])
    return replay.steps(table, weights, modes)


def row(out, impl):
    return out[out["impl"] == impl].iloc[0]


def test_time_per_thousand_steps_weights_each_step_and_splits_by_mode():
    per_step = paths([("a", "decode", "x", "correct", "fi", "fa2", "pass", 10.0),
                      ("b", "verify", "x", "correct", "fi", "fa2", "pass", 40.0),
                      ("a", "decode", "y", "correct", "fi", "fa2", "pass", 20.0),
                      ("b", "verify", "z", "correct", "flex", "flex", "pass", 30.0)], {"a": 3, "b": 1})
    assert per_step["ms_per_1000"].tolist() == [30 / 4, 40 / 4, 60 / 4, 30 / 4]  # us per step x its share
    out = replay.per_thousand_steps(per_step, ("fi",)).astype(object).fillna("-")  # empty cells are NaN
    assert out.drop(columns="backend").values.tolist() == [
        ["x", 40 / 4, 30 / 4, (40 + 30) / 4, "4/4"],
        ["y", "-", 60 / 4, "-", "3/4"],  # no verify: no verify cell, no total
        ["z", 30 / 4, "-", "-", "1/4"],
        ["best single fi path", 40 / 4, 30 / 4, 70 / 4, "4/4"],  # z is FlexAttention's
        ["best single path of any backend", 30 / 4, 30 / 4, 60 / 4, "4/4"],  # z serves verify, x decode
        [replay.SERVED, 30 / 4, 30 / 4, 60 / 4, "4/4"]]
    assert row(out, "best single fi path")["backend"] == "verify: x [fa2]; decode: x [fa2]"
    assert row(out, replay.SERVED)["backend"] == "verify: z [flex] 1/1; decode: x [fa2] 3/3"


def test_a_replay_written_before_layer_types_weighs_as_one_layer():
    per_step = paths([("a", "decode", "x", "correct", "fi", "fa2", "pass", 10.0),
                      ("b", "verify", "x", "correct", "fi", "fa2", "pass", 40.0)], {"a": 3, "b": 1})
    old = replay.per_thousand_steps(per_step.drop(columns="layer"), ("fi",))  # a replay.csv of an earlier release
    assert old.equals(replay.per_thousand_steps(per_step, ("fi",)))
    assert row(old, "best single fi path")["all steps ms"] == (30 + 40) / 4


def test_a_mixed_trace_is_served_step_by_step_where_no_one_path_runs_a_mode():
    """Decode steps with sinks (s) and without (p): only the sink path runs s, it skips p; the window
    path skips s; the slow torch path runs both; a faster known bug never counts."""
    per_step = paths([("s", "decode", "sink", "correct", "fi", "fa2", "pass", 20.0),
                      ("p", "decode", "sink", "correct", "fi", "fa2", "skip", None),
                      ("s", "decode", "window", "correct", "fi", "fa2", "skip", None),
                      ("p", "decode", "window", "correct", "fi", "fa2", "pass", 18.0),
                      ("s", "decode", "torch-trim", "correct", "torch", "torch", "pass", 5000.0),
                      ("p", "decode", "torch-trim", "correct", "torch", "torch", "pass", 5000.0),
                      ("p", "decode", "bug", "known-bug", "fi", "fa2", "xpass", 1.0),
                      ("v", "verify", "window", "correct", "fi", "fa2", "pass", 50.0),
                      ("v", "verify", "bug", "known-bug", "fi", "fa2", "xfail", None)], {"s": 1, "p": 3, "v": 1})
    out = replay.per_thousand_steps(per_step, ("fi",))
    assert out["decode ms"].isna().tolist()[:2] == [True, True]  # neither FlashInfer path runs every decode step
    assert row(out, "torch-trim")["decode ms"] == 5000.0 * 4 / 5
    single = row(out, "best single fi path")
    assert single["decode ms"] != single["decode ms"] and single["verify ms"] == 50.0 / 5
    assert single["backend"] == "verify: window [fa2]; decode: no one path passed every step"
    assert single["steps covered"] == "1/5"
    best = row(out, replay.SERVED)
    assert best["decode ms"] == (20.0 * 1 + 18.0 * 3) / 5 and best["all steps ms"] == (20.0 + 54.0 + 50.0) / 5
    assert best["backend"] == "verify: window [fa2] 1/1; decode: window [fa2] 3/4, sink [fa2] 1/4"


def test_a_mode_no_correct_path_served_is_empty_and_names_the_step():
    per_step = paths([("a", "decode", "x", "correct", "fi", "fa2", "pass", 10.0),
                      ("b", "decode", "x", "correct", "fi", "fa2", "fail", None),
                      ("b", "decode", "bug", "known-bug", "fi", "fa2", "pass", 1.0)], {"a": 1, "b": 1})
    best = row(replay.per_thousand_steps(per_step), replay.SERVED)
    assert best["decode ms"] != best["decode ms"] and best["steps covered"] == "0/2"
    assert best["backend"] == "decode: no correct path passed step b"


def test_a_replay_missing_whole_steps_claims_no_mode_it_did_not_cover():
    rows = [("a", "decode", "x", "correct", "fi", "fa2", "pass", 10.0),
            ("c", "verify", "x", "correct", "fi", "fa2", "pass", 20.0)]
    weights = {"a": 3, "b": 1, "c": 1}  # b (a decode step) has no rows yet: an interrupted replay
    blind = paths(rows, weights)
    assert blind[blind["case_id"] == "b"]["status"].tolist() == ["not run"]
    out = replay.per_thousand_steps(blind)
    assert out["impl"].tolist() == ["x", replay.SERVED]
    assert out.drop(columns=["impl", "backend", "steps covered"]).isna().all(axis=None)
    told = replay.per_thousand_steps(paths(rows, weights, {"a": "decode", "b": "decode", "c": "verify"}))
    assert told["verify ms"].tolist() == [4.0, 4.0] and told["decode ms"].isna().all()
    assert row(told, replay.SERVED)["backend"].endswith("decode: no correct path passed step b")


def test_model_features_in_a_trace_line_is_one_step_where_it_changes_nothing(tmp_path):
    line = {"mode": "decode", "model": "gemma-3-1b", "requests": [[40, 1]]}
    steps = traces.read(write(tmp_path, [line, {**line, "model_features": True}, {**line, "model_features": False}]))
    assert list(steps.values()) == [3]  # gemma-3 has no sinks or soft-cap to drop
    with pytest.raises(traces.TraceError, match="line 1: model_features applies to a model preset"):
        traces.read(write(tmp_path, [{"mode": "decode", **LAYER, "model_features": False, "requests": [[4, 1]]}]))


@pytest.mark.slow
def test_replay_runs_end_to_end_and_reports(tmp_path, one_figure):
    trace = write(tmp_path, STEPS)
    r = invoke("replay", trace, "--impl", "torch-trim", "--impl", "paged-window", "--device", "cpu",
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "| torch-trim | torch |" in r.output and "5/5" in r.output
    table, meta = derived.load(tmp_path / "run")
    assert meta["trace"]["steps"] == 5 and meta["trace"]["distinct"] == 3
    assert set(table[table["impl"] == "torch-trim"]["status"]) == {"pass"}
    text = report.write(tmp_path / "run", tmp_path / "report").read_text()
    assert "## Trace replay" in text and "| torch-trim | torch |" in text
    from swabench.publish import findings
    page = pages_text(findings.write([tmp_path / "run"], tmp_path / "FINDINGS.md"))
    replay = page.split("## Trace replay")[1].split("\n## ")[0]
    assert (f"Replay of a trace not in the repository (sha256 {meta['trace']['sha256'][:16]}) (5 steps, 3 distinct) "
            f"(`{tmp_path / 'run'}`).") in replay  # a trace outside the repository is named by its hash
    assert f"From `{tmp_path / 'run'}`:\n\n| impl | backend |" in replay
    per_model = page.split("## Per model")[1].split("\n## ")[0]
    assert f"From `{tmp_path / 'run'}`:" in per_model and "gemma-3-1b" in per_model  # the gemma-3-1b verify step


@pytest.mark.slow
def test_a_mixed_trace_replays_on_the_cpu_served_step_by_step(tmp_path, monkeypatch, one_figure):
    """A decode line of a model with sinks beside decode and verify lines without: FlexAttention has no
    sink term and a sinks-only path (as FlashInfer's sink wrapper) runs nothing else, so neither runs
    every decode step; served at its best takes each step from the path that passed it."""
    import dataclasses

    from swabench.impls import registry

    sinks_only = dataclasses.replace(registry.get("torch-trim"), name="torch-sinks-only", requires=frozenset({"sinks"}))
    monkeypatch.setitem(registry._REGISTRY, "torch-sinks-only", sinks_only)
    trace = write(tmp_path, [{"mode": "decode", "model": "gpt-oss-20b", "requests": [[40, 1], [200, 1]], "count": 2},
                             {"mode": "decode", **LAYER, "requests": [[40, 1], [70, 1]], "count": 5},
                             {"mode": "verify", **LAYER, "requests": [[50, 3]]}])
    r = invoke("replay", trace, "--impl", "flex-window", "--impl", "torch-sinks-only", "--device", "cpu",
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    per_step = pd.read_csv(tmp_path / "run" / "replay.csv")
    assert per_step.groupby("impl")["status"].apply(sorted).to_dict() == {  # no point of a path's non-sink steps
        "flex-window": ["pass", "pass", "skip"], "torch-sinks-only": ["pass"]}
    assert per_step.groupby("mode")["count"].sum().to_dict() == {"decode": 2 * 2 + 5, "verify": 1}  # rows x count
    timed = per_step.dropna(subset=["median_us"])
    assert (timed["ms_per_1000"] == timed["median_us"] * timed["count"] / 8).all()
    lines = {line.split(" | ")[0].lstrip("| "): line for line in r.output.splitlines() if line.startswith("| ")}
    assert lines["flex-window"].startswith("| flex-window | flex | ") and "| 6/8 |" in lines["flex-window"]
    served = lines["served at its best"]
    assert "decode: flex-window [flex] 5/7, torch-sinks-only [torch] 2/7" in served and "| 8/8 |" in served
    text = report.write(tmp_path / "run", tmp_path / "report").read_text()
    assert served in text  # the report's table is made from replay.csv


def test_one_path_per_layer_type_serves_a_mix_that_no_one_path_serves(tmp_path, monkeypatch, one_figure):
    """GPT-OSS's sink layer and a plain layer, both decoding: the batched SDPA path has no sink term and the
    sinks-only path runs nothing else, so no one path of the library passes every decode step; one path per
    layer type does, and the picks serve the whole mix."""
    import dataclasses

    from swabench.impls import registry

    sinks_only = dataclasses.replace(registry.get("torch-trim"), name="torch-sinks-only", requires=frozenset({"sinks"}))
    monkeypatch.setitem(registry._REGISTRY, "torch-sinks-only", sinks_only)
    trace = write(tmp_path, [{"mode": "decode", "model": "gpt-oss-20b", "requests": [[40, 1], [200, 1]], "count": 2},
                             {"mode": "decode", **LAYER, "requests": [[40, 1], [70, 1]], "count": 5}])
    r = invoke("replay", trace, "--impl", "torch-batch", "--impl", "torch-sinks-only", "--device", "cpu",
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    per_step = pd.read_csv(tmp_path / "run" / "replay.csv")
    layers = sorted(per_step["layer"].unique())
    assert len(layers) == 2 and any(layer.endswith("sinks bfloat16") for layer in layers), layers
    by_impl = replay.per_thousand_steps(per_step, ("torch",)).set_index("impl")
    for layer in layers:
        row = by_impl.loc[f"best single torch path, {layer}"]
        path = "torch-sinks-only" if "sinks" in layer else "torch-batch"
        assert row["backend"] == f"decode: {path} [torch]" and row["all steps ms"] == row["decode ms"]
    picks, best = by_impl.loc["torch's picks, one path per layer type"], by_impl.loc[replay.SERVED]
    assert picks["steps covered"] == best["steps covered"] == "7/7"
    assert picks["all steps ms"] == pytest.approx(best["all steps ms"])  # each layer type has one path only
    assert picks["decode ms"] == pytest.approx(sum(by_impl.loc[f"best single torch path, {x}", "decode ms"]
                                                   for x in layers))


def test_a_bad_trace_exits_2(tmp_path):
    r = invoke("replay", write(tmp_path, [{"mode": "decode", "requests": [[1, 1]]}]), "--device", "cpu")
    assert r.exit_code == 2 and "line 1: give the layer" in r.output


def test_equal_steps_are_one_step_however_they_are_spelt(tmp_path):
    a = {"mode": "decode", "num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "window_left": 15,
         "logits_soft_cap": 50, "dtype": "bf16", "requests": [[40, 1]]}
    b = {**{k: v for k, v in a.items() if k != "window_left"}, "sliding_window": 16, "logits_soft_cap": 50.0,
         "dtype": "bfloat16", "count": 5}
    steps = traces.read(write(tmp_path, [a, b]))
    assert list(steps.values()) == [6] and list(traces.weights(steps).values()) == [6]
    s = traces.scenario(tmp_path / "t.jsonl", steps, ["torch-trim"])
    assert set(traces.weights(steps)) == {c.case_id for c in s.cases}  # the table's ids carry the weights


@pytest.mark.parametrize("extra,message", [({"page_size": [16]}, "one value per layer key"),
                                           ({"model": "gemma-3-1b"}, "the model preset sets num_qo_heads"),
                                           ({"requests": [[-1, 2]]}, r"requests: must be a non-empty list of \[prefix >= 0")])
def test_more_bad_lines(tmp_path, extra, message):
    with pytest.raises(traces.TraceError, match="line 1: " + message):
        traces.read(write(tmp_path, [{"mode": "extend", **LAYER, "requests": [[1, 2]], **extra}]))


def test_an_interrupted_replay_resumes(tmp_path):
    trace = write(tmp_path, STEPS)
    first = invoke("replay", trace, "--impl", "torch-trim", "--device", "cpu", "--out", tmp_path / "run")
    again = invoke("replay", trace, "--impl", "torch-trim", "--device", "cpu", "--out", tmp_path / "run", "--resume")
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert len(derived.load(tmp_path / "run")[0]) == 3


# results.csv, meta.json and scenario.toml of the first H200 replay of traces/example.jsonl (at 0cbb748,
# frozen): its long per-request lists were labelled before labels carried their sum, so steps share labels
H200_REPLAY = Path(__file__).resolve().parent / "fixtures" / "h200-replay"


@pytest.mark.slow
def test_the_h200_replay_reports_every_mode_and_the_mix_at_its_best(tmp_path, monkeypatch):
    from swabench.publish import plots

    monkeypatch.setattr(plots, "FIGURES", {"backends": plots.FIGURES["backends"]})  # the one figure this test reads
    text = report.write(H200_REPLAY, tmp_path).read_text()
    assert text.startswith("# swabench report: replay-example, gemma-3-27b\n")  # one model: the title names it
    replay = text.split("## Trace replay")[1].split("\n## ")[0]
    best = [line for line in replay.splitlines() if line.startswith("| served at its best | extend: ")]
    assert len(best) == 1 and best[0].endswith("| 84.4 | 200/200 |")  # every step served, by the fastest
    single = [line for line in replay.splitlines() if line.startswith("| best single flashinfer path | ")]
    assert len(single) == 1 and "decode: decode-trim [fa2] |" in single[0]
    decode = text.split("## Decode:")[1].split("\n## ")[0]
    assert decode.count("| 1024 | [32 of 4096..16384] |") == 1  # the drawn contexts, one row for their label
    assert (tmp_path / "backends.png").exists()  # steps that share a label each keep their bar


def test_a_run_without_model_presets_has_no_per_model_table():
    table = pd.DataFrame({"model": [float("nan")], "kind": ["correct"], "status": ["pass"], "median_us": [1.0],
                          "mode": ["decode"], "storage": ["paged"], "impl": ["x"], "backend": ["fa2"]})
    assert serving.fastest_per_model(Run("x", table, {})).empty


@pytest.mark.parametrize("extra,field", [({"model": {"a": 1}}, "model"), ({"dtype": {"x": 1}}, "dtype"),
                                         ({"page_layout": {"a": [1]}}, "page_layout")])
def test_a_table_where_a_name_belongs_is_refused_with_the_names(tmp_path, extra, field):
    line = {"mode": "decode", **LAYER, "requests": [[1, 1]], **extra}
    if "model" in extra:
        line = {k: v for k, v in line.items() if k not in axes.MODEL_SETS}
    with pytest.raises(axes.ScenarioError, match=rf"line 1\.{field}: must be one of \w"):
        traces.read(write(tmp_path, [line]))
    r = invoke("replay", tmp_path / "t.jsonl", "--device", "cpu")
    assert r.exit_code == 2 and f"line 1.{field}: must be one of" in r.output


def test_a_line_nested_too_deeply_is_refused(tmp_path):
    with pytest.raises(traces.TraceError, match="line 2: nested too deeply"):
        traces.read(write(tmp_path, [STEPS[0], '{"mode": ' + "[" * 100_000]))


def test_a_trace_over_the_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = write(tmp_path, STEPS)
    monkeypatch.setattr(traces, "MAX_BYTES", path.stat().st_size)
    assert sum(traces.read(path).values()) == 5  # exactly the cap: read
    monkeypatch.setattr(traces, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(traces.TraceError, match=f"larger than {path.stat().st_size - 1} bytes"):
        traces.read(path)
    r = invoke("replay", path, "--device", "cpu")
    assert r.exit_code == 2 and "larger than" in r.output


def test_a_replay_where_every_point_skips_is_refused_with_no_table(tmp_path):
    """sink-window needs CUDA: on the CPU every point is a skip, so there is nothing to run or weigh."""
    trace = write(tmp_path, [{"mode": "decode", "model": "gpt-oss-20b", "requests": [[40, 1]]}])
    r = invoke("replay", trace, "--impl", "sink-window", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "points skips here: flashinfer needs CUDA (device is cpu)" in r.output, r.output
    assert not any(line.startswith("|") for line in r.output.splitlines()) and not (tmp_path / "run").exists()


def test_a_line_with_both_spellings_of_the_window_is_refused(tmp_path):
    both = {"mode": "decode", **LAYER, "window_left": 127, "sliding_window": 4096, "requests": [[40, 1]]}
    with pytest.raises(traces.TraceError, match="line 2: give only one of window_left / sliding_window"):
        traces.read(write(tmp_path, [STEPS[0], both]))
    r = invoke("replay", tmp_path / "t.jsonl", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "window_left 127, sliding_window 4096" in r.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("counts,message", [
    ([2 ** 63], "line 1: count: must be an integer from 1 to 1000000000000, got 9223372036854775808"),
    ([10 ** 12 + 1], "line 1: count: must be an integer from 1 to 1000000000000"),
    ([2 ** 63 - 1, 2 ** 63 - 1], "line 1: count: must be an integer from 1 to"),
    ([10 ** 12, 1], "line 2: count: the trace's counts add up to more than 1000000000000 steps")])
def test_counts_are_bounded_so_no_sum_overflows(tmp_path, counts, message):
    path = write(tmp_path, [{**STEPS[0], "count": c} for c in counts])
    with pytest.raises(traces.TraceError, match=message):
        traces.read(path)
    r = invoke("replay", path, "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "count:" in r.output and not (tmp_path / "run").exists()
    assert sum(traces.read(write(tmp_path, [{**STEPS[0], "count": 10 ** 12}])).values()) == 10 ** 12


def test_non_causal_and_chunked_lines_become_such_cases(tmp_path):
    extend = {"mode": "extend", **LAYER, "requests": [[0, 24], [30, 8]]}
    chunk = {k: v for k, v in LAYER.items() if k != "sliding_window"}
    steps = traces.read(write(tmp_path, [extend, {**extend, "causal": True}, {**extend, "causal": False},
                                         {"mode": "decode", **chunk, "attention_chunk": 32, "requests": [[40, 1]]},
                                         {"mode": "decode", **chunk, "attention_chunk": 0, "window_left": 15,
                                          "requests": [[40, 1]]}]))
    assert list(steps.values()) == [2, 1, 1, 1]  # causal true and attention_chunk 0 are the defaults
    cases = traces.scenario(tmp_path / "t.jsonl", steps, ["torch-trim"]).cases
    assert [(c.causal, c.attention_chunk, c.window_left) for c in cases] == \
        [(True, 0, 15), (False, 0, 15), (True, 32, -1), (True, 0, 15)]


@pytest.mark.parametrize("extra,message", [
    ({"causal": "no"}, r"line 1\.causal: must be true or false"),
    ({"attention_chunk": -2}, r"line 1\.attention_chunk: must be an integer >= 0"),
    ({"attention_chunk": 32}, r"line 1\.attention_chunk: 32 with window_left 15: a layer is chunked or sliding"),
    ({"attention_chunk": 32, "window_left": -1, "causal": False}, r"line 1\.causal: chunked attention is causal")])
def test_causal_and_attention_chunk_are_checked_as_the_scenario_axes(tmp_path, extra, message):
    line = {"mode": "extend", **{k: v for k, v in LAYER.items() if k != "sliding_window"}, "window_left": 15,
            "requests": [[0, 24]], **extra}
    with pytest.raises(axes.ScenarioError, match=message):
        traces.read(write(tmp_path, [line]))


def test_a_trace_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(s) + "\n" for s in STEPS).encode())
    assert sum(traces.read(path).values()) == 5


def test_a_key_given_twice_on_a_line_is_refused(tmp_path):
    path = write(tmp_path, [STEPS[0], '{"mode": "decode", "count": 2, "num_qo_heads": 4, "num_kv_heads": 2, '
                                      '"head_dim": 64, "sliding_window": 16, "requests": [[1, 1]], "count": 3}'])
    with pytest.raises(traces.TraceError, match="line 2: key 'count' given twice"):
        traces.read(path)
    r = invoke("replay", path, "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "line 2: key 'count' given twice" in r.output


def test_the_picks_over_every_backend_leave_out_the_suites_own_pytorch_paths():
    """An engine picks among FlashInfer, cuDNN, FA4 and FlexAttention, never the suite's reference in PyTorch."""
    per_step = paths([("a", "decode", "x", "correct", "fi", "fa2", "pass", 10.0),
                      ("a", "decode", "t", "correct", "torch", "torch", "pass", 1.0),
                      ("a", "decode", "f", "correct", "flex", "flex", "pass", 5.0)], {"a": 1})
    out = replay.per_thousand_steps(per_step, ("fi",))
    assert row(out, "best single path of any backend")["backend"] == "decode: f [flex]"
    assert row(out, replay.SERVED)["backend"].startswith("decode: t [torch]")  # step by step, every correct path
