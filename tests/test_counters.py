"""Nsight Compute's counters: finding ncu, its command line, reading its raw page (real output from the H200
node), the calibration, the reasons it can give for reading nothing, and the whole `profile --tool ncu`
flow against a stand-in ncu on the CPU: ncu.csv, the rows' columns, the findings' section and figure."""

import contextlib
import csv
import gzip
import importlib.util
import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from swabench.analysis import derived
from swabench.cli import tools
from swabench.measure import counters
from swabench.publish import limits
from swabench.publish.sections import Run, machine
from swabench.publish.sections.machine import short_kernel
from swabench.store import schema

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ncu"
ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_page_reads_as_one_counted_kernel(monkeypatch):
    """Real output: a bf16 kernel reading 32 MiB inside the start/end range 'counted-se graph [fa2] #c4'."""
    raw = (FIXTURES / "probe-raw.csv").read_text()
    assert counters.kernels(raw).empty  # its range is not one swabench counts
    monkeypatch.setattr(counters, "RANGE", "counted-se ")
    k = counters.kernels(raw)
    assert k[["case_id", "impl", "backend"]].values.tolist() == [["c4", "graph", "fa2"]]
    assert k["dram_read_bytes"].iloc[0] == 33_563_648 and k["dram_write_bytes"].iloc[0] == 11_693_824
    assert k["l2_bytes"].iloc[0] == 102_615_968 and k["ncu_duration_us"].iloc[0] == pytest.approx(16.672)
    assert abs(k["dram_read_bytes"].iloc[0] / (32 << 20) - 1) < counters.CALIBRATION_TOLERANCE
    assert k["kernel"].iloc[0].startswith("void vectorized_elementwise_kernel<8, AUnaryFunctor")


def test_swabenchs_own_page_from_the_h200_gives_the_cliff():
    """Real output of a count run: the CUDA-core decode with the window at plan reads the whole K/V, 246x
    what the window needs; the tensor-core decode, the prefill wrapper and the trimmed table read ~1x."""
    raw = gzip.decompress((FIXTURES / "cliff-raw.csv.gz").read_bytes()).decode()
    k = counters.kernels(raw)
    assert len(k) == 11 and counters.calibration(k)["trusted"]
    assert counters.calibration(k)["read_ratio"] == pytest.approx(268447232 / (256 << 20))
    points = counters.per_point(k).set_index(["impl", "backend"])
    floor = 8716288  # Q and the window's K/V of 32 requests from their first page: min_read_bytes of the case
    amp = points["dram_read_bytes"] / floor
    assert amp[("decode-window", "fa2")] > 200 and points.loc[("decode-window", "fa2"), "kernels_counted"] == 2
    for path in [("decode-tc-window", "fa2"), ("paged-window", "fa2"), ("decode-trim", "fa2")]:
        assert amp[path] < 1.25, path
    whole = 2 * 32 * 32769 * 8 * 64 * 2  # every key of every request, K and V, bf16
    assert points.loc[("decode-window", "fa2"), "dram_read_bytes"] == pytest.approx(whole, rel=0.03)
    assert short_kernel(k.loc[k["impl"] == "decode-window", "kernel"].iloc[0]) == "BatchDecodeWithPagedKVCacheKernel"


def test_messages_after_the_table_and_values_ncu_could_not_read():
    """A line ncu prints after the table is not a kernel; an 'n/a' value is missing, and so is its point's sum."""
    raw = gzip.decompress((FIXTURES / "cliff-raw.csv.gz").read_bytes()).decode()
    rows = list(csv.reader(io.StringIO(raw)))
    column = rows[0].index("dram__bytes_read.sum")
    rows[3][column] = "n/a"  # the first point's first kernel
    page = io.StringIO()
    csv.writer(page, quoting=csv.QUOTE_ALL).writerows(rows)
    k = counters.kernels(page.getvalue() + "==WARNING== something ncu says at the end\n")
    assert len(k) == 11 and k["dram_read_bytes"].isna().sum() == 1
    first = k.loc[k["dram_read_bytes"].isna(), ["case_id", "impl", "backend"]].iloc[0].tolist()
    sums = counters.per_point(k).set_index(["case_id", "impl", "backend"])
    assert pd.isna(sums.loc[tuple(first), "dram_read_bytes"]) and sums["dram_read_bytes"].notna().sum() == 5


def test_a_range_name_with_colons_still_splits():
    cell = ' "3:swabench:count a:b [fa2] #x:none:none:RGB:0xff:REGISTERED:count a:b [fa2] #x"  "4:other:count c:d" '
    assert counters._counted_point(cell) == ("x", "a:b", "fa2")
    assert counters._counted_point(' "1:nvtx:count z [fa2] #y:none:none:RGB:0xff:REGISTERED:count z [fa2] #y" ') is None


def test_pages_that_are_not_ncu_raw_pages_are_refused():
    with pytest.raises(ValueError, match="no header row"):
        counters.kernels("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no column dram__bytes_write.sum"):
        counters.kernels('"ID","Kernel Name","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
                         '"dram__bytes_read.sum","lts__t_bytes.sum","gpu__time_duration.sum"\n')
    rows = list(csv.reader(io.StringIO((FIXTURES / "probe-raw.csv").read_text())))
    rows[1][rows[0].index("dram__bytes_read.sum")] = "Pbyte"
    page = io.StringIO()
    csv.writer(page, quoting=csv.QUOTE_ALL).writerows(rows)
    with pytest.raises(ValueError, match="dram__bytes_read.sum in 'Pbyte'"):
        counters.kernels(page.getvalue())


def test_per_point_sums_and_the_calibration():
    k = pd.DataFrame({"ncu_id": [0, 1, 2, 3], "case_id": ["calibration", "c", "c", "d"], "impl": ["copy", "p", "p", "p"],
                      "backend": ["torch", "fa2", "fa2", "fa2"], "kernel": ["copy", "A", "B", "A"],
                      "dram_read_bytes": [counters.CALIBRATION_BYTES * 1.004, 10.0, 5.0, 7.0],
                      "dram_write_bytes": [1.0, 2.0, 3.0, 4.0], "l2_bytes": [0.0, 1.0, 1.0, 1.0],
                      "ncu_duration_us": [1.0, 1.0, 1.0, 1.0]})
    p = counters.per_point(k).set_index("case_id")
    assert p.loc["c", "dram_read_bytes"] == 15 and p.loc["c", "kernels_counted"] == 2 and "calibration" not in p.index
    assert counters.calibration(k)["trusted"] and counters.calibration(k)["read_ratio"] == pytest.approx(1.004)
    assert counters.calibration(k, "warm")["trusted"] is None  # a warm L2 may serve part of the copy
    k.loc[0, "dram_read_bytes"] = counters.CALIBRATION_BYTES * 1.02
    assert counters.calibration(k)["trusted"] is False
    assert counters.calibration(k.iloc[1:])["trusted"] is False  # no copy counted: nothing to trust


def test_ncu_is_found_on_path_then_in_the_cuda_images_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(counters.shutil, "which", lambda name: None)
    for version in ("2024.1.0", "2025.3.1", "2025.10.0"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "ncu").write_text("")
    monkeypatch.setattr(counters, "SEARCHED", (str(tmp_path / "*" / "ncu"),))
    assert counters.find() == str(tmp_path / "2025.10.0" / "ncu")
    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    assert counters.find() == "/usr/bin/ncu"
    monkeypatch.setattr(counters.shutil, "which", lambda name: None)
    monkeypatch.setattr(counters, "SEARCHED", (str(tmp_path / "none" / "ncu"),))
    assert counters.find() is None


def test_the_command_counts_only_the_count_ranges_with_the_clocks_as_found():
    cold = counters.command("ncu", "r", "r.log", ["python", "-m", "swabench"], "cold")
    assert cold[cold.index("--clock-control") + 1] == "none" and cold[cold.index("--cache-control") + 1] == "all"
    assert cold[cold.index("--graph-profiling") + 1] == "node" and "--nvtx" in cold
    assert cold[cold.index("--nvtx-include") + 1] == "regex:swabench@count .*"
    assert cold[cold.index("--metrics") + 1].split(",") == list(counters.METRICS)
    assert cold[-3:] == ["python", "-m", "swabench"]
    warm = counters.command("ncu", "r", "r.log", [], "warm")
    assert warm[warm.index("--cache-control") + 1] == "none"
    whole = counters.command("ncu", "r", "r.log", [], "cold", "call")
    assert whole[whole.index("--graph-profiling") + 1] == "graph" and whole[whole.index("--cache-control") + 1] == "all"
    assert counters.range_name("decode-window", "fa2", "206beedd0021") == "count decode-window [fa2] #206beedd0021"


def test_the_reasons_ncu_gives_for_reading_nothing():
    assert counters.unreadable("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission "
                               "to access NVIDIA GPU Performance Counters") .startswith("ERR_NVGPUCTRPERM")
    assert "LibraryNotLoaded" in counters.unreadable("==ERROR== Failed to initialize the profiler: LibraryNotLoaded")
    assert counters.unreadable("==PROF== Profiling \"k\" - 0: 0%....50%....100% - 1 pass") is None


def test_short_kernel_names():
    assert machine.short_kernel("void flashinfer::BatchDecodeWithPagedKVCacheKernel<128u, (PosEncodingMode)0, "
                                "Params<bf16, int>>(Params<bf16, int>)") == "BatchDecodeWithPagedKVCacheKernel"
    assert machine.short_kernel("void ns::MergeStatesKernel<8u>(T*)") == "MergeStatesKernel"
    assert machine.short_kernel("kernel") == "kernel"


# ---------------------------------------------------------------- the flow, against a stand-in ncu

@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """`ncu` on PATH is tests/fixtures/ncu/fake_ncu.py.  Its calls, and the `python -m swabench` command it profiles,
    run inside this process, as the command line each was given (as processes, each would pay seconds of
    start-up); every other command runs as a process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(f"#!/bin/sh\nexec {sys.executable} {FIXTURES / 'fake_ncu.py'} \"$@\"\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # where counters.find() looks
    spec = importlib.util.spec_from_file_location("fake_ncu", FIXTURES / "fake_ncu.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    real = subprocess.run

    def run(args, *rest, **kw):
        args = [str(a) for a in args]
        if args[0] == str(ncu):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = fake.main(args[1:])
            return subprocess.CompletedProcess(args, code, printed.getvalue() if kw.get("capture_output") else None)
        if args[:3] == [sys.executable, "-m", "swabench"]:
            from conftest import invoke
            return subprocess.CompletedProcess(args, invoke(*args[3:]).exit_code)
        return real(args, *rest, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    return ncu


def profile_cpu(tmp_path, *impls, env=None):
    """`swabench profile cpu --tool ncu` on its decode cases, the stand-in ncu running the child on the CPU."""
    from swabench.run import profiling

    out = tmp_path / "counted"
    args = [a for impl in impls for a in ("--impl", impl)] + ["--case", "decode"]
    return out, profiling.run_under_ncu(str(ROOT / "scenarios" / "cpu.toml"), out, args, "cold")


@pytest.mark.slow
def test_a_counted_run_joins_each_points_bytes_to_its_row(fake_ncu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NCU_AMPLIFY", "torch-mask=240")
    out, result = profile_cpu(tmp_path, "torch-trim", "torch-mask")
    assert result.skipped is None and result.meta["calibration"]["trusted"]
    assert result.meta["tool"] == "ncu 2025.3.1.0" and result.meta["points"] > 0
    table, meta = derived.load(out)
    assert meta["counters"]["kernels"] == 2 * meta["counters"]["points"]
    counted = table.dropna(subset=["dram_read_bytes"])
    assert set(counted["impl"]) == {"torch-trim", "torch-mask"} and (counted["kernels_counted"] == 2).all()
    amp = counted.groupby("impl")["read_amplification"].median()
    assert amp["torch-trim"] == pytest.approx(1.0) and amp["torch-mask"] == pytest.approx(240)
    kernels = pd.read_csv(out / schema.COUNTERS, dtype={"case_id": str})
    assert {"case", "kernel", "dram_read_bytes", "l2_bytes", "ncu_duration_us"} <= set(kernels.columns)
    assert (out / "ncu.log").exists() and (out / "profile.ncu-rep").exists() and (out / "ncu-raw.csv.gz").exists()
    run = Run(str(out), table, meta)
    assert run.profiled and not run.timed
    section = machine.bytes_table(run)
    mask = section[section["path"] == "torch-mask [torch]"].iloc[0]
    assert mask["DRAM read / needed"].startswith("240x") and mask["kernels of a call"] == "torch-maskMainKernel + torch-maskMergeKernel"
    assert "read" in machine.cliff(run) and "(240x)" in machine.cliff(run)
    fig = limits.bytes_read(table, meta)
    assert len(fig.axes) == 1 and len(fig.axes[0].collections) == 2
    tools.print_counted(result, out)  # what `swabench profile --tool ncu` prints at the end
    printed = capsys.readouterr().out
    assert "| decode | torch-mask [torch] |" in printed and "s a point under ncu" in printed


@pytest.mark.slow
def test_without_permission_the_gated_run_is_kept_and_says_why(fake_ncu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NCU_MODE", "noperm")
    out, result = profile_cpu(tmp_path, "torch-trim")
    assert result.kernels is None and result.skipped.startswith("ERR_NVGPUCTRPERM")
    table, meta = derived.load(out)
    assert meta["counters"]["skipped"] == result.skipped and (table["status"] == "pass").any()
    assert table["dram_read_bytes"].isna().all() and not (out / schema.COUNTERS).exists()
    tools.print_counted(result, out)
    assert "ncu: skipped: ERR_NVGPUCTRPERM" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_and_an_untrusted_counter(fake_ncu, tmp_path, monkeypatch):
    """`swabench profile --tool ncu` end to end (torch told to take the CPU for the GPU the command asks for):
    exit 0 with its table, here counting a call at a time; exit 1, saying why, when the calibration copy reads 5%
    more than it holds, and the findings page then keeps that run's counts out of its answers."""
    from conftest import invoke

    import swabench.cli.tools as cli_tools
    monkeypatch.setattr(cli_tools, "device_of", lambda *a: __import__("torch").device("cpu"))
    assert invoke("profile", "cpu", "--tool", "ncu", "--against", tmp_path, "--out", tmp_path / "x").exit_code == 2
    refused = invoke("profile", "cpu", "--tool", "nsys", "--ncu-unit", "call", "--out", tmp_path / "y")
    assert refused.exit_code == 2 and "--ncu-unit call: ncu only" in refused.output and not (tmp_path / "y").exists()
    monkeypatch.setenv("FAKE_NCU_AMPLIFY", "torch-trim=500")  # a loop counted whole: its intermediates too
    whole = invoke("profile", "cpu", "--tool", "ncu", "--ncu-unit", "call", "--impl", "torch-trim", "--case", "decode",
                   "--out", tmp_path / "whole")
    assert whole.exit_code == 0 and "| decode | torch-trim [torch] | 4 | 500x" in whole.output
    assert f"| {machine.WHOLE} |" in whole.output
    counted_whole = Run(str(tmp_path / "whole"), *derived.load(tmp_path / "whole"))
    assert counted_whole.meta["counters"]["unit"] == "call"
    assert "--graph-profiling graph" in counted_whole.meta["counters"]["options"]
    assert machine.cliff(counted_whole) == "" and "counted as one workload" in machine.bytes_said(counted_whole)[1]
    assert machine.worst_cliff([counted_whole]) == ""  # the cliff names a kernel: kernel-by-kernel runs only
    monkeypatch.setenv("FAKE_NCU_CALIBRATION", "1.05")
    monkeypatch.setenv("FAKE_NCU_AMPLIFY", "torch-trim=50")
    bad = invoke("profile", "cpu", "--tool", "ncu", "--impl", "torch-trim", "--case", "decode", "--out", tmp_path / "bad")
    assert bad.exit_code == 1 and "1.0500x" in bad.output and "not to be trusted" in bad.output
    untrusted = Run(str(tmp_path / "bad"), *derived.load(tmp_path / "bad"))
    assert machine.trusted(counted_whole) and not machine.trusted(untrusted)
    said = machine.amplified([counted_whole, untrusted], "decode")
    assert "`torch-trim [torch]` 500x (calls)" in said and "50x" not in said.replace("500x", "")
    assert "none of this run's counts is to be trusted" in machine.bytes_said(untrusted)[0]


def test_without_ncu_nothing_is_written(tmp_path, monkeypatch):
    from swabench.run import profiling

    monkeypatch.setattr(counters, "find", lambda: None)
    result = profiling.run_under_ncu("cpu.toml", tmp_path / "never", [], "cold")
    assert "ncu not found" in result.skipped and not (tmp_path / "never").exists()


def test_the_count_run_is_for_a_gpu(tmp_path):
    from conftest import invoke

    done = invoke("run", "cpu", "--device", "cpu", "--count", "--out", tmp_path / "x")
    assert done.exit_code == 2 and "--count" in done.stderr and not (tmp_path / "x").exists()
