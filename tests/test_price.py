"""Whole-model step pricing (`swabench price`): each model step becomes its windowed layer (the preset) and its
global layer (the same heads and features, no window), weighted by the layer counts of the preset's schedule;
each layer step at its fastest correct path; the KV bytes a request holds with and without eviction."""

import re

import pandas as pd
import torch
import pytest
from conftest import invoke

from swabench.analysis import price as weighing
from swabench.run import price
from swabench.inputs import models

TRACE = ('{"mode": "decode", "model": "gemma-3-1b", "requests": [[700, 1], [900, 1]], "count": 3}\n'
         '{"mode": "verify", "model": "gemma-3-1b", "requests": [[600, 4]]}\n'
         '{"mode": "decode", "model": "gpt-oss-20b", "requests": [[100, 1]]}\n')


@pytest.mark.parametrize("name,windowed,global_", [("gpt-oss-120b", 18, 18), ("gemma-3-27b", 52, 10),
                                                    ("llama-4-scout", 36, 12), ("mistral-7b-v0.1", 32, 0)])
def test_each_model_step_is_its_windowed_and_its_global_layer_by_the_schedule(name, windowed, global_):
    m = models.get(name)
    steps = price.template_steps(m)
    assert {s.mode for s in steps} == {"extend", "verify", "decode"} and set(steps.values()) == {1}
    layered, kind = price.layer_steps(m, steps)
    assert sum(layered.values()) == len(steps) * (windowed + global_)
    glob = [s for s in layered if kind[s] == "global"]
    assert len(glob) == (len(steps) if global_ else 0)
    for s in glob:  # the global layer keeps the heads and features, and has no window and no chunk
        layer = dict(s.layer)
        assert layer["window_left"] == -1 and "attention_chunk" not in layer and "model" not in layer
        assert (layer["num_qo_heads"], layer["sinks"]) == (m.num_qo_heads, m.sinks) and layered[s] == global_
        assert (layer["logits_soft_cap"], layer.get("sm_scale")) == (m.logits_soft_cap, m.sm_scale)


def test_the_global_layer_keeps_the_soft_cap_and_the_scale():
    layer = dict(price.global_layer(models.get("gemma-2-27b")))
    assert layer["logits_soft_cap"] == 50.0 and layer["sm_scale"] == 144 ** -0.5 and layer["window_left"] == -1


def test_kv_bytes_keep_every_page_or_evict_those_before_each_windowed_layers_window(tmp_path):
    m = models.get("gpt-oss-20b")  # 24 layers, 12 sliding (W = 127), 8 KV heads of 64: 2 KiB per key and layer
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"mode": "decode", "model": "gpt-oss-20b", "requests": [[1000, 1]]}\n')
    steps = price.trace_steps(m, trace)
    row = price.kv_bytes(m, steps)[0]
    per_key_layer = 2 * 8 * 64 * 2
    pages = 1008  # 1001 keys in 16-key pages
    assert row["kv_mib_all_pages"] * 2 ** 20 == 24 * pages * per_key_layer
    kept = pages - 864  # the window of the query at 1000 starts at 873: its page starts at 864
    assert row["kv_mib_evicted"] * 2 ** 20 == (12 * pages + 12 * kept) * per_key_layer


def test_a_chunked_model_keeps_the_chunk_of_each_windowed_layer(tmp_path):
    m = models.get("llama-4-scout")  # 48 layers, 36 chunked (C = 8192), 8 KV heads of 128: 4 KiB per key and layer
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"mode": "decode", "model": "llama-4-scout", "requests": [[9000, 1]]}\n')
    row = price.kv_bytes(m, price.trace_steps(m, trace))[0]
    pages, chunk_start = 9008, 8192  # 9001 keys; the query at 9000 is in the chunk from 8192
    assert row["kv_mib_evicted"] * 2 ** 20 == (12 * pages + 36 * (pages - chunk_start)) * 4096
    trace.write_text('{"mode": "decode", "model": "llama-4-scout", "requests": [[100, 1]]}\n')  # inside one chunk
    row = price.kv_bytes(m, price.trace_steps(m, trace))[0]
    assert row["kv_mib_evicted"] == row["kv_mib_all_pages"]


def test_the_weighing_takes_the_fastest_correct_path_the_mask_and_the_full_table_decode():
    rows = []
    for case_id, mode, layer, paths in [("w", "decode", "window", {"decode-tc-trim": 10.0, "paged-mask": 40.0,
                                                                    "decode-window": 90.0, "paged-plan-no-window": 1.0}),
                                        ("g", "decode", "global", {"paged-window": 20.0, "paged-mask": 25.0})]:
        for impl, us in paths.items():
            rows.append(dict(case_id=case_id, impl=impl, backend="fa2", status="pass", median_us=us,
                             kind="known-bug" if impl == "paged-plan-no-window" else "correct"))
    meta = {"price": {"model_steps": 2, "layers": {"w": "window", "g": "global"}},
            "trace": {"weights": {"w": 2 * 3, "g": 2 * 1}, "modes": {"w": "decode", "g": "decode"}}}
    t = weighing.per_mode(pd.DataFrame(rows), meta).set_index("mode")
    assert t.loc["decode", "windowed layers (ms)"] == 10.0 * 6 / 2  # a known bug never counts, however fast
    assert t.loc["decode", "global layers (ms)"] == 20.0 * 2 / 2
    assert t.loc["decode", weighing.NAIVE] == 40.0 * 6 / 2 + 20.0
    assert t.loc["decode", weighing.FULL_TABLE_DECODE] == t.loc["all modes", weighing.FULL_TABLE_DECODE] == 290.0
    rows = [r for r in rows if not (r["case_id"] == "g" and r["impl"] == "paged-window")]
    rows = [dict(r, status="fail") if r["case_id"] == "g" else r for r in rows]
    t = weighing.per_mode(pd.DataFrame(rows), meta).set_index("mode")
    assert t["global layers (ms)"].isna().all() and t["whole model (ms)"].isna().all()  # no correct path passed
    assert weighing.blanks(pd.DataFrame(rows).assign(reason=None), meta) == {}


def test_a_blank_slower_choice_says_why():
    """Llama 4's group of 5 has no CUDA-core decode kernel, and FlashInfer's masks have no sink term; a column
    blank because one step of several has no time says so too, and the full-table decode is fa2's kernel
    (cuDNN's or auto's pick of decode-window is another kernel)."""
    reason = "FlashInfer's CUDA-core decode kernel has no GQA group of 5"
    row = dict(case_id="w", status="skip", kind="correct", median_us=None, backend="fa2")
    rows = pd.DataFrame([dict(row, impl="decode-window", reason=reason),
                         dict(row, impl="paged-mask", reason="no sink term"),
                         dict(row, impl="decode-tc-trim", status="pass", reason=None, median_us=5.0),
                         dict(row, impl="decode-window", backend="cudnn", status="pass", reason=None, median_us=4.0)])
    meta = {"price": {"layers": {"w": "window"}}, "trace": {"modes": {"w": "decode"}}}
    assert weighing.blanks(rows, meta) == {weighing.NAIVE: ["paged-mask: no sink term"],
                                           weighing.FULL_TABLE_DECODE: [f"decode-window: {reason}"]}
    two = pd.concat([rows, pd.DataFrame([dict(row, case_id="v", impl=i, status="pass", reason=None, median_us=9.0)
                                         for i in ("decode-window", "paged-mask")])])
    meta = {"price": {"layers": {"w": "window", "v": "window"}}, "trace": {"modes": {"w": "decode", "v": "decode"}}}
    assert set(weighing.blanks(two, meta)) == {weighing.NAIVE, weighing.FULL_TABLE_DECODE}  # w still has none


@pytest.mark.slow
def test_price_runs_a_models_lines_of_a_trace_on_the_cpu(tmp_path, one_figure):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    r = invoke("price", "--model", "gemma-3-1b", trace, "--impl", "torch-trim", "--impl", "torch-mask",
               "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "22 windowed of 26 layers" in r.output
    assert f'"{weighing.FULL_TABLE_DECODE}" is blank: no such path timed that step' in r.output  # no decode-window
    t = pd.read_csv(tmp_path / "run" / "price.csv").set_index("mode")
    assert list(t.index) == ["decode", "verify", "all modes"]
    whole = t["windowed layers (ms)"] + t["global layers (ms)"]
    assert (abs(whole - t["whole model (ms)"]) < 1e-9 * whole).all()
    assert ((t["windowed share"] > 0) & (t["windowed share"] < 1)).all()
    assert (t[weighing.NAIVE] >= t["whole model (ms)"]).all()  # the mask is among the correct paths it beats
    results = pd.read_csv(tmp_path / "run" / "results.csv")
    assert len(results["case_id"].unique()) == 4  # 2 steps x (window, global); the gpt-oss line is not this model's
    steps = pd.read_csv(tmp_path / "run" / "replay.csv")
    decode_window = steps[(steps["mode"] == "decode") & (steps["count"] == 3 * 22)]
    best = decode_window[decode_window["status"] == "pass"]["median_us"].min()
    got = t.loc["decode", "windowed layers (ms)"]
    assert abs(got - best * 3 * 22 / 4) < 1e-6 * got  # weighted by model steps x windowed layers, over 4 model steps
    from swabench.publish import report
    page = (report.write(tmp_path / "run", tmp_path / "plots")).read_text()
    assert "## Whole-model price" in page and "22 windowed of 26 layers" in page and "## Trace replay" not in page


def test_a_price_runs_the_engines_correct_paths_unless_told(tmp_path, monkeypatch):
    """The peers and the known bugs are for the sweeps: a price weighs what engines serve layers with."""
    from swabench.impls import registry
    from swabench.run import price as pricing
    cpu = torch.device("cpu")
    assert pricing.engine_paths(cpu) == ["torch-trim", "torch-mask"]  # no GPU: the embedded paths stand in
    monkeypatch.setattr(pricing, "CPU_LIMIT_S", float("inf"))  # the steps of a GPU: refused on the CPU otherwise
    request = pricing.request("gemma-3-1b", None, (), (), tmp_path / "a", cpu)
    assert set(request.scenario.implementations) == {"torch-trim", "torch-mask"}
    monkeypatch.setattr(registry.Implementation, "availability",  # a GPU node with FlashInfer
                        lambda impl, device: None if impl.library in ("flashinfer", "torch", "flex") else "not here")
    names = pricing.engine_paths(torch.device("cuda"))
    assert {"paged-window", "paged-mask", "decode-window", "sink-window", "chunk-virtual"} <= set(names)
    assert not {"flex-window", "torch-trim", "torch-batch", "paged-plan-no-window", "chunk-as-window"} & set(names)


def test_a_price_that_would_take_the_cpu_past_its_limit_is_refused_with_an_estimate(tmp_path, monkeypatch):
    """The template steps are a GPU's: gating and timing them on the CPU takes half an hour and more."""
    from swabench.core import footprint
    from swabench.run import cpu_cost, price as pricing
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    r = invoke("price", "--model", "gemma-3-1b", "--device", "cpu", "--out", tmp_path / "p")
    assert r.exit_code == 2 and not (tmp_path / "p").exists()
    said = re.search(r"price on the CPU: gemma-3-1b's template steps in models\.toml, sized for a GPU \(up to 32769 keys, "
                     r"batches of up to 32\) need up to ([\d.]+) T multiply-adds to gate and time \(8 layer steps\), "
                     r"about (\d+) min on 2 idle CPU threads, past the 10 min", r.output)
    assert said, r.output
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)  # a trace's few short steps take seconds
    assert pricing.request("gemma-3-1b", trace, (), (), tmp_path / "b", torch.device("cpu"))
    assert pricing.request("gemma-3-1b", None, (), (), tmp_path / "r", torch.device("cpu"), resume=True)  # chosen
    monkeypatch.setattr(pricing, "CPU_LIMIT_S", float("inf"))
    scenario = pricing.request("gemma-3-1b", None, (), (), tmp_path / "c", torch.device("cpu")).scenario
    cost = cpu_cost.estimate(scenario.points, torch.device("cpu"), at=cpu_cost.IDLE)
    assert float(said[1]) == round(cost.multiply_adds / 1e12, 1) and int(said[2]) == round(cost.seconds / 60)
    one = next(c for c in scenario.cases if c.mode == "decode")  # 32 requests, one query on 32769 keys, 4 heads x 256
    assert footprint.call_work(one, "torch", every_key=True)[0] == 2 * 32 * 32769 * 4 * 256


def test_bad_input_names_the_problem_before_anything_runs(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    r = invoke("price", "--model", "gemma-9", trace, "--device", "cpu", "--out", tmp_path / "a")
    assert r.exit_code == 2 and "--model: unknown model 'gemma-9'" in r.output
    r = invoke("price", "--model", "llama-4-scout", trace, "--device", "cpu", "--out", tmp_path / "b")
    assert r.exit_code == 2 and "no line of model 'llama-4-scout'" in r.output
    trace.write_text('{"mode": "decode", "model": "gemma-3-1b", "page_size": 32, "requests": [[700, 1]]}\n')
    r = invoke("price", "--model", "gemma-3-1b", trace, "--device", "cpu", "--out", tmp_path / "c")
    assert r.exit_code == 2 and "a line of gemma-3-1b sets page_size" in r.output
    assert not any((tmp_path / d).exists() for d in "abc")


def test_one_path_per_layer_type_is_the_fastest_over_all_its_steps_not_per_step():
    """Two decode steps of the windowed layer: decode-trim wins the small one and decode-tc-trim the large one;
    an engine configures one of them for the layer, the one with the least time over both."""
    paths = {"small": {"decode-trim": 5.0, "decode-tc-trim": 8.0}, "large": {"decode-trim": 50.0, "decode-tc-trim": 30.0},
             "g": {"paged-window": 20.0, "decode-tc-trim": 25.0}}
    rows = [dict(case_id=c, impl=i, backend="fa2", status="pass", median_us=us, kind="correct")
            for c, times in paths.items() for i, us in times.items()]
    meta = {"price": {"model_steps": 1, "layers": {"small": "window", "large": "window", "g": "global"}},
            "trace": {"weights": {"small": 1, "large": 1, "g": 1}, "modes": dict.fromkeys(paths, "decode")}}
    assert weighing.picks(pd.DataFrame(rows), meta) == {("window", "decode"): ("decode-tc-trim", "fa2"),
                                                        ("global", "decode"): ("paged-window", "fa2")}
    t = weighing.per_mode(pd.DataFrame(rows), meta).set_index("mode")
    assert t.loc["decode", "whole model (ms)"] == 5.0 + 30.0 + 20.0  # step by step
    assert t.loc["decode", weighing.PICKS] == 8.0 + 30.0 + 20.0  # one path for the windowed layer
    rows = [r for r in rows if not (r["case_id"] == "small" and r["impl"] == "decode-tc-trim")]
    t = weighing.per_mode(pd.DataFrame(rows), meta).set_index("mode")
    assert t.loc["decode", weighing.PICKS] == 5.0 + 50.0 + 20.0  # only decode-trim passed both
