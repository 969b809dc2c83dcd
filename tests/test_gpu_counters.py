"""On a CUDA machine: Nsight Compute's DRAM counter gated like every other number (a copy of N bytes reads N
bytes), the clock read around each timed point, and the decode cliff's bytes.

Marked ``gpu``: skipped without CUDA; the ncu tests skip, with ncu's reason, where it is missing or cannot read
the counters (no permission, a runtime without its profiler library)."""

import subprocess
import sys
from pathlib import Path

import pytest

from swabench.analysis import derived
from swabench.measure import counters

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
CLIFF_CASE = "206beedd0021"  # serving.toml: decode b32 p32768 q1 W127 ps16 h64/8 d64 bfloat16 (GPT-OSS-20B's layer)


def ncu_or_skip() -> str:
    ncu = counters.find()
    if ncu is None:
        pytest.skip("ncu not found on PATH or under /opt/nvidia/nsight-compute/*/")
    return ncu


def test_a_copy_of_n_bytes_reads_n_bytes(tmp_path):
    """The calibration every count run starts with, on its own: 256 MiB read and written by one kernel, cold L2."""
    ncu = ncu_or_skip()
    child = [sys.executable, "-c", "import torch; from swabench.measure import counters; "
                                   "counters.calibrate(torch.device('cuda'))"]
    log = tmp_path / "ncu.log"
    subprocess.run(counters.command(ncu, str(tmp_path / "copy"), str(log), child, "cold"), check=True, cwd=ROOT)
    report = tmp_path / "copy.ncu-rep"
    if not report.exists():
        pytest.skip(counters.unreadable(log.read_text()) or "ncu profiled no kernel")
    k = counters.kernels(counters.read_report(ncu, str(report)))
    check = counters.calibration(k)
    assert len(k) == 1 and check["trusted"], check
    assert abs(k["dram_read_bytes"].iloc[0] / counters.CALIBRATION_BYTES - 1) <= 0.01


def test_a_timed_point_records_the_clock_around_it(tmp_path, write_scenario):
    pytest.importorskip("pynvml")
    from conftest import TINY, invoke

    out = tmp_path / "run"
    result = invoke("run", write_scenario(TINY), "--device", "cuda", "--impl", "torch-trim", "--out", out)
    assert result.exit_code == 0, result.output
    timed = derived.load(out)[0].dropna(subset=["median_us"])
    assert len(timed) and (timed["sm_clock_mhz_before"] > 0).all() and (timed["sm_clock_mhz_after"] > 0).all()
    assert timed["clock_reasons_before"].notna().all() and timed["throttled"].notna().all()


def test_the_cuda_core_decode_reads_the_whole_table(tmp_path):
    """GPT-OSS-20B's decode layer, 32 requests of 32768 keys, window 127, 16-row pages: the CUDA-core kernel
    with the window at plan reads the whole K/V (2 GiB for a floor of 8.9 MB); the tensor-core decode, the
    prefill wrapper and the CUDA-core kernel over a table trimmed to the window read what the window needs."""
    ncu_or_skip()
    pytest.importorskip("flashinfer")
    out = tmp_path / "cliff"
    impls = ["decode-window", "decode-tc-window", "paged-window", "decode-trim"]
    done = subprocess.run([sys.executable, "-m", "swabench", "profile", "serving", "--tool", "ncu", "--case",
                           CLIFF_CASE, "--out", str(out), *[a for i in impls for a in ("--impl", i)]],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    if "ncu: skipped" in done.stderr:
        pytest.skip(done.stderr.split("ncu: skipped:")[1].strip())
    table, meta = derived.load(out)
    assert meta["counters"]["calibration"]["trusted"], meta["counters"]["calibration"]
    fa2 = table[(table["backend"] == "fa2") & table["read_amplification"].notna()].set_index("impl")
    assert set(impls) <= set(fa2.index), fa2.index.tolist()
    assert fa2.loc["decode-window", "read_amplification"] >= 200
    for impl in impls[1:]:
        assert fa2.loc[impl, "read_amplification"] <= 1.25, (impl, fa2.loc[impl, "read_amplification"])
