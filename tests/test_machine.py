"""The machine's limit on the CPU: the roofline columns on frozen rows of a committed H200 run, the clock
columns from NVML's readings, and the pages and figures made of them."""

import re
from pathlib import Path

import pandas as pd
import pytest

from swabench.analysis import derived
from swabench.measure import clocks
from swabench.publish import limits
from swabench.publish.sections import Run, answers, machine, method

H200_RUN = Path(__file__).resolve().parent / "fixtures" / "h200-run"  # an H200: 3201 MHz memory, 132 SMs at 1980 MHz
DRAM_BYTES_PER_S = 2 * 3201e6 * 6016 / 8  # two transfers a clock on the 6016-bit bus NVML reports for an H200
BF16_FLOPS_PER_S = 132 * 1980e6 * 4096  # sm_90: 4 tensor cores x 512 FMA x 2 flops per clock per SM


@pytest.fixture(scope="module")
def h200():
    return derived.load(H200_RUN)


def test_the_floor_is_the_larger_of_bytes_and_flops_at_the_datasheet_ceiling(h200):
    table, meta = h200
    timed = table.dropna(subset=["median_us"])
    assert timed["floor_us"].notna().all() and timed["pct_of_floor"].notna().all()
    row = timed.iloc[0]
    memory = row["min_bytes"] / DRAM_BYTES_PER_S * 1e6
    compute = row["flops"] / BF16_FLOPS_PER_S * 1e6
    assert row["floor_us"] == pytest.approx(max(memory, compute))
    assert row["pct_of_floor"] == pytest.approx(100 * max(memory, compute) / row["median_us"])
    assert row["pct_peak_tbps"] == pytest.approx(100 * row["tbps"] * 1e12 / DRAM_BYTES_PER_S)
    assert (timed["pct_of_floor"] < 100).all(), "no kernel beats the datasheet"
    verify = timed[(timed["mode"] == "verify") & (timed["impl"] == "paged-window")]
    assert verify["floor_us"].tolist() == pytest.approx((verify["min_bytes"] / DRAM_BYTES_PER_S * 1e6).tolist()), \
        "verify is memory-bound"


def test_frozen_rows_give_the_same_roofline_columns():
    rows = pd.DataFrame({"min_bytes": [4.2e6, 1e6], "flops": [1e8, 7.6e12], "median_us": [2.0, 20000.0],
                         "tflops": [0.5, 380.0], "tbps": [2.1, 0.05], "dram_read_bytes": [8e6, None],
                         "min_read_bytes": [4e6, 5e5]})
    out = derived.per_row(rows, {"copy_tbps": 4.2, "bf16_matmul_tflops": 760.0})
    assert out["floor_us"].tolist() == pytest.approx([1.0, 1e4])  # 4.2 MB at 4.2 TB/s; 7.6 TFLOP at 760 TFLOP/s
    assert out["pct_of_floor"].tolist() == pytest.approx([50.0, 50.0])
    assert out["read_amplification"].iloc[0] == 2.0 and out["read_amplification"].isna().iloc[1]
    assert "floor_us" not in derived.per_row(rows, None)  # no peaks (the CPU backend): no floor
    warm = derived.per_row(rows.assign(l2=["warm", "cold"]), {"copy_tbps": 4.2, "bf16_matmul_tflops": 760.0})
    assert warm["floor_us"].isna().iloc[0] and warm["floor_us"].iloc[1] == pytest.approx(1e4)  # warm L2: no floor
    datasheet = derived.per_row(rows, {"copy_tbps": 4.2, "bf16_matmul_tflops": 760.0, "datasheet_tbps": 8.4,
                                       "datasheet_tflops": 1520.0})
    assert datasheet["floor_us"].tolist() == pytest.approx([0.5, 5e3])  # the datasheet's, where the peaks have it
    assert datasheet["pct_peak_tbps"].iloc[0] == pytest.approx(25.0)


def test_clock_columns_flag_power_and_heat_only():
    calm = clocks.Reading(1980, 0x0, 10, 0)
    idle = clocks.Reading(345, 0x1, 10, 0)
    assert clocks.columns(calm, idle) == {"sm_clock_mhz_before": 1980, "sm_clock_mhz_after": 345,
                                          "clock_reasons_before": "none", "clock_reasons_after": "gpu_idle",
                                          "throttled": False}
    assert clocks.columns(calm, clocks.Reading(1485, 0x4, 10, 0))["throttled"]  # the power cap
    assert clocks.columns(calm, clocks.Reading(1980, 0x0, 10, 5))["throttled"]  # thermal time grew between
    assert clocks.columns(calm, clocks.Reading(1980, 0x10, 99, 0))["throttled"]  # power time grew, sync boost is not
    assert clocks.names(0x4 | 0x40) == "sw_power_cap+hw_thermal"
    assert clocks.columns(None, calm) == {}


def test_no_clock_off_a_gpu_or_from_a_binding_without_the_calls(monkeypatch):
    import sys
    import types

    import torch

    assert clocks.read(torch.device("cpu")) is None
    old = types.SimpleNamespace(NVML_PERF_POLICY_POWER=0, NVML_PERF_POLICY_THERMAL=1, NVML_CLOCK_SM=1,
                                nvmlDeviceGetViolationStatus=lambda h, p: types.SimpleNamespace(violationTime=0),
                                nvmlDeviceGetClockInfo=lambda h, c: 1980)  # no nvmlDeviceGetCurrentClocksEventReasons
    monkeypatch.setitem(sys.modules, "pynvml", old)
    monkeypatch.setattr(clocks, "_handle", lambda uuid: object())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid="x"))
    assert clocks.read(torch.device("cuda")) is None  # no clock columns, and no failed point


def test_measurement_quality_counts_the_throttled_points(h200):
    table, meta = h200
    table = table.assign(throttled=table["throttled"].astype(object))
    timed = table["median_us"].notna()
    table.loc[timed, "sm_clock_mhz_before"] = 1980
    table.loc[timed, "sm_clock_mhz_after"] = 1755
    table.loc[timed, "throttled"] = False
    table.loc[table.index[timed][:3], "throttled"] = True
    row = method.measurement(Run("x", table, meta)).iloc[0]
    assert row["throttled (power or heat)"] == f"3/{int(timed.sum())}"
    assert row["SM MHz before-after (median)"] == "1980-1755"
    assert "throttled (power or heat)" not in method.measurement(Run("x", *derived.load(H200_RUN)))


def test_the_roofline_section_and_the_answers_name_the_machines_limit(h200):
    run = Run("h200", *h200)
    section = machine.roofline(run).set_index("path")
    t = run.table
    g = t[(t["mode"] == "verify") & (t["impl"] == "paged-window") & (t["backend"] == "fa2") & t["median_us"].notna()]
    assert section.loc["paged-window [fa2]", "verify"] == \
        f"{g['pct_of_floor'].median():.0f}% ({g['pct_of_floor'].max():.0f}%, {len(g)})"
    said = machine.roofline_said(run)[0]
    verify = t[(t["mode"] == "verify") & (t["kind"] == "correct") & (t["status"] == "pass") & t["median_us"].notna()]
    assert f"verify {len(verify)} of {len(verify)}" in said, said
    steps = answers.per_step([run])
    assert steps[answers.FLOOR].str.fullmatch(r"\d+%").all()


def test_every_path_keeps_one_look():
    from swabench.impls import registry
    from swabench.publish.style import look

    looks = [tuple(look(i.name).values()) for i in registry.all_implementations()]
    assert len(set(looks)) == len(looks), "two implementations share a colour and a marker"


def test_rate_figure_is_in_tb_per_s_where_a_step_is_memory_bound(h200):
    fig = limits.rate_vs_context(*h200)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["extend (TFLOP/s)", "verify (TB/s)", "draft_extend (TB/s)", "decode (TB/s)"]
    assert all(ax.get_legend() is None for ax in fig.axes) and fig.legends, "one legend, outside the panels"
    roof = limits.roofline(*h200)
    assert roof.axes[0].get_xscale() == "log" and roof.legends


ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = "tests/fixtures/published/results"  # frozen copies of the published runs (tests/fixtures/make_published.py)
COUNTED = [f"{PUBLISHED}/h200-ncu-decode-cliff-0.7.4", f"{PUBLISHED}/h200-ncu-default-0.7.4"]


@pytest.fixture(scope="module")
def published():
    """The committed default run and the two Nsight Compute runs (FlashInfer 0.7.4, H200), as findings reads them."""
    return [Run(folder, *derived.load(ROOT / folder)) for folder in [f"{PUBLISHED}/h200-default-0.7.4", *COUNTED]]


def test_the_counted_runs_borrow_times_from_their_timed_twin_only(published):
    default, cliff, decode = published
    times = machine.timed_twin(published, decode)
    counted = machine.counted_points(decode.table)
    assert len(times) and all(key in times.index for key in zip(counted["case_id"], counted["impl"], counted["backend"]))
    assert machine.timed_twin(published, cliff).empty  # serving's timed run is not among these


def test_what_each_decode_path_reads_on_the_h200(published):
    words = machine.amplified(published, "decode")
    past, counted = map(int, re.match(r"(\d+) of (\d+) past 1.25x, worst `decode-window \[fa2\]`", words).groups())
    assert 2 <= past < counted and "`paged-mask [fa2]`" in words
    for path in ("paged-window [fa2]", "decode-tc-window [fa2]", "decode-trim [fa2]"):
        assert f"`{path}`" not in words
    worst = machine.worst_cliff(published)
    assert "`decode-window [fa2]`" in worst and "(251x)" in worst and "the whole K/V its page table holds" in worst
    assert " in 400 us" in worst  # its graph median, from the timed default run
    verify = machine.amplified(published, "verify")
    past, counted = map(int, re.match(r"(\d+) of (\d+) past 1.25x, worst `(ragged|paged)-mask", verify).groups()[:2])
    assert past < counted and "`paged-window [fa2]`" not in verify  # the window path reads what it needs


def test_the_findings_sections_of_the_machines_limit(published):
    from swabench.publish.sections import by_key

    roof = "\n".join(by_key("roofline").for_runs(published))
    assert f"From `{PUBLISHED}/h200-default-0.7.4`:" in roof and "![roofline](plots/h200-default-0.7.4/roofline.png)" in roof
    said = "\n".join(by_key("bytes").for_runs(published))
    assert said.count(f"From `{PUBLISHED}/h200-ncu-") == 2 and "calibration copy of 268 MB read 1.0000x" in said
    assert "![bytes_read](plots/h200-ncu-default-0.7.4/bytes_read.png)" in said
    page = "\n".join(by_key("answers").for_runs(published))
    assert "**What each path reads**" in page and "- The worst: on `decode b32 p32768" in page


def test_a_step_where_every_path_reads_what_its_window_needs_says_so(published):
    counted = [r for r in published if machine.trusted(r) and len(machine.counted_points(r.table))]
    rows = machine.counted_points(counted[0].table)
    mode = rows["mode"].iloc[0]
    lean = [Run(r.name, r.table.assign(read_amplification=1.0), r.meta) for r in counted]
    points = [machine.counted_points(r.table) for r in lean]
    paths = set().union(*(p.loc[p["mode"] == mode, "path"] for p in points))
    assert machine.amplified(lean, mode, named=False) == f"all {len(paths)} within 1.25x"
