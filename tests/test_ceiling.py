"""The ceiling floors divide by: the GPU's peak at its maximum clocks from NVML (a stand-in pynvml here), filled on read
for a run made before they were recorded, the measured rates where neither gives them, said on every page; and
no point of a published run above 100% of its floor."""

import json
import sys
import types
from pathlib import Path

import pytest

from swabench.analysis import derived
from swabench.measure import ceiling, clocks
from swabench.publish import limits
from swabench.publish.sections import Run, machine, method
from swabench.store import schema, tables

ROOT = Path(__file__).resolve().parents[1]
# every published run's meta and timed rows, frozen by tests/fixtures/make_published.py (freeze_ceiling)
PUBLISHED = sorted(p.parent for p in (ROOT / "tests" / "fixtures" / "published" / "ceiling").glob("*/meta.json"))
MEASURED = {"bf16_matmul_tflops": 790.0, "copy_tbps": 4.2, "method": "bf16 matmul and a device copy"}
H200_META = {"format_version": 10, "gpu": "NVIDIA H200", "gpu_sms": 132, "compute_capability": "9.0",
             "nvidia_smi.clocks.max.mem": "3201", "nvidia_smi.clocks.max.sm": "1980", "peaks": MEASURED}


@pytest.mark.parametrize("folder", PUBLISHED, ids=lambda p: p.name)
def test_no_point_of_a_published_run_is_above_its_floor(folder):
    table, meta = derived.load(folder)
    if "peaks" not in meta:
        assert "pct_of_floor" not in table or table["pct_of_floor"].isna().all()  # no peaks, no floor
        return
    assert meta["peaks"]["datasheet_tbps"] > meta["peaks"]["copy_tbps"], meta["peaks"]["ceiling"]
    floored = table.dropna(subset=["pct_of_floor"])
    assert (floored["pct_of_floor"] < 100).all(), floored.nlargest(1, "pct_of_floor")[["case", "impl", "pct_of_floor"]]
    assert (table["pct_peak_tbps"].dropna() < 100).all() and (table["pct_peak_tflops"].dropna() < 100).all()


def test_an_older_meta_gets_the_ceiling_from_its_clocks_and_the_h200s_bus(tmp_path):
    (tmp_path / schema.META).write_text(json.dumps(H200_META))
    before = (tmp_path / schema.META).read_bytes()
    peaks = tables.read_meta(tmp_path)["peaks"]
    assert (tmp_path / schema.META).read_bytes() == before, "reading never rewrites a run's files"
    assert peaks["datasheet_tbps"] == pytest.approx(2 * 3201e6 * ceiling.BUS_BITS["NVIDIA H200"] / 8 / 1e12)
    assert peaks["datasheet_tflops"] == pytest.approx(132 * 1980e6 * 4096 / 1e12)
    assert ceiling.ceilings(peaks) == (peaks["datasheet_tbps"], peaks["datasheet_tflops"])
    assert {k: peaks[k] for k in MEASURED} == MEASURED, "the measured rates stay beside it"
    assert "6016-bit bus NVML reports for an NVIDIA H200" in peaks["ceiling"] and "3201 MHz" in peaks["ceiling"]
    assert schema.migrate({**H200_META, "peaks": peaks})["peaks"] == peaks, "a meta with its ceiling keeps it"
    assert "peaks" not in schema.migrate({k: v for k, v in H200_META.items() if k != "peaks"})


def test_an_unknown_gpu_keeps_the_measured_rates_and_says_so():
    peaks = schema.migrate({**H200_META, "gpu": "NVIDIA Z100", "compute_capability": "12.0"})["peaks"]
    assert "datasheet_tbps" not in peaks and "datasheet_tflops" not in peaks
    assert ceiling.ceilings(peaks) == (4.2, 790.0)
    assert "none is known here for GPU 'NVIDIA Z100'" in peaks["ceiling"]
    assert "no tensor-core rate known for compute capability 12.0" in peaks["ceiling"]
    assert "4.20 TB/s (measured copy)" in machine.ceiling_said(peaks)
    known_sms = schema.migrate({**H200_META, "gpu": "NVIDIA Z100"})["peaks"]  # sm_90: only the bus is unknown
    assert "datasheet_tbps" not in known_sms and known_sms["datasheet_tflops"] > known_sms["bf16_matmul_tflops"]


@pytest.fixture(scope="module")
def h200_run():
    return derived.load(ROOT / "tests" / "fixtures" / "h200-run")


def test_every_page_and_figure_names_the_ceiling_it_used(h200_run):
    table, meta = h200_run
    said = method.timing_said(Run("h200", table, meta))[-1]
    assert said.startswith("Floors divide by the GPU's ceiling: DRAM 4.81 TB/s = 2 x 3201 MHz x 6016 bits") and \
        "Attainable, measured on the node: copy 4.23 TB/s, bf16 matmul 762 TFLOP/s" in said, said
    said = machine.roofline_said(Run("h200", table, meta))[0]
    assert "4.81 TB/s (peak: NVML's maximum memory clock x bus width)" in said, said
    labels = limits.roofline(table, meta).axes[0].get_legend_handles_labels()[1]
    assert "ceiling: 4.81 TB/s (peak at maximum clocks), 1071 TFLOP/s (peak at maximum clocks)" in labels
    assert "attainable (measured): copy 4.23 TB/s, matmul 762 TFLOP/s" in labels
    rates = {k: meta["peaks"][k] for k in MEASURED}  # as the run recorded them, before the ceiling was filled
    measured = {**meta, "peaks": schema.migrate({**H200_META, "gpu": "NVIDIA Z100", "compute_capability": "12.0",
                                                 "peaks": rates})["peaks"]}
    labels = limits.roofline(table, measured).axes[0].get_legend_handles_labels()[1]
    assert labels[-1] == "ceiling: 4.23 TB/s (measured copy), 762 TFLOP/s (measured matmul)", labels


def stand_in_nvml(**calls):
    """A pynvml with the calls ``peaks.measure`` makes, for a part of an H100 SXM's numbers: 2619 MHz memory on a
    5120-bit bus, SMs at 1830 MHz (its datasheet's boost clock: the tensor-core peak there is its 989 TFLOP/s;
    ``calls`` replaces any)."""
    clock = {1: 1830, 2: 2619}
    module = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, nvmlInit=lambda: None,
                                   nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
                                   nvmlDeviceGetMaxClockInfo=lambda h, c: clock[c],
                                   nvmlDeviceGetMemoryBusWidth=lambda h: 5120)
    for name, call in calls.items():
        setattr(module, name, call)
    return module


@pytest.fixture
def gpu(monkeypatch):
    """``peaks.measure`` on the CPU: a stand-in device's properties and its three measured rates."""
    import torch

    from swabench.measure import peaks

    clocks._handle.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(uuid="GPU-stand-in", multi_processor_count=132, major=9,
                                                        minor=0))
    for name, rate in (("_matmul_tflops", 760.0), ("_copy_tbps", 3.0), ("_read_tbps", 3.1)):
        monkeypatch.setattr(peaks, name, lambda device, rate=rate: rate)
    yield lambda: peaks.measure(torch.device("cuda"))
    clocks._handle.cache_clear()


def test_a_new_run_records_the_ceiling_from_nvml(gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml())
    peaks = gpu()
    assert (peaks["memory_clock_mhz"], peaks["memory_bus_bits"], peaks["sm_clock_mhz"], peaks["sms"]) == \
        (2619, 5120, 1830, 132)
    assert peaks["datasheet_tbps"] == pytest.approx(3.35, abs=0.005)  # H100 SXM's datasheet: 3.35 TB/s
    assert round(peaks["datasheet_tflops"]) == 989  # and 989 TFLOP/s dense bf16
    assert (peaks["copy_tbps"], peaks["read_tbps"], peaks["bf16_matmul_tflops"]) == (3.0, 3.1, 760.0)
    assert peaks["ceiling"].endswith("from NVML's maximum memory and SM clocks and memory bus width")
    assert "read 3.10 TB/s" in machine.attainable(peaks)


@pytest.mark.parametrize("nvml, why", [
    (stand_in_nvml(nvmlInit=lambda: 1 / 0), "NVML could not be read (no nvidia-ml-py binding"),
    (stand_in_nvml(nvmlDeviceGetMemoryBusWidth=None), "NVML could not be read (TypeError"),
])
def test_without_nvml_a_new_run_keeps_the_measured_rates_and_says_why(gpu, monkeypatch, nvml, why):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    peaks = gpu()
    assert ceiling.ceilings(peaks) == (3.0, 760.0) and "datasheet_tbps" not in peaks
    assert why in peaks["ceiling"] and "the measured copy's 3.00 TB/s" in peaks["ceiling"], peaks["ceiling"]
