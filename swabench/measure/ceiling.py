"""The GPU's ceiling, its peak at its maximum clocks, which no kernel beats: DRAM bandwidth from the maximum memory
clock and the memory bus width (double data rate: two transfers a clock), and the dense bf16 tensor-core rate from
the SMs, their maximum clock and the flops an SM's tensor cores do a clock.  The roofline floor divides by it; the
node's measured copy, read stream and matmul (``measure.peaks``) stay beside it as what a kernel can attain.
Where a number of the part is not known, that side's ceiling is the measured rate, and ``ceiling`` says so.

Arithmetic only: the store fills an older run's ceiling with it, without torch or NVML."""

from __future__ import annotations

# Dense bf16 flops a clock per SM, by compute capability: sm_90 has 4 tensor cores of 512 FMA (x 2 flops);
# 132 SMs x 1830 MHz x 4096 is H100 SXM's datasheet 989 TFLOP/s; at NVML's maximum SM clock (1980 MHz) the peak is
# higher, and that is the ceiling: no kernel runs faster than the maximum clock.
TENSOR_FLOPS_PER_CLOCK = {"9.0": 4096}

# The memory bus width NVML reports (nvmlDeviceGetMemoryBusWidth), by the GPU's name as torch gives it, for
# runs made before it was recorded.  An H200 reads 6016 bits (results/h200-calls-ceiling/nvml-probe.log; with
# its 3201 MHz: 4.81 TB/s, the datasheet's 4.8).  H100 SXM: five 1024-bit HBM3 stacks (with its 2619 MHz:
# the datasheet's 3.35 TB/s).
BUS_BITS = {"NVIDIA H200": 6016, "NVIDIA H100 80GB HBM3": 5120}


def dram_tbps(memory_clock_mhz: float, bus_bits: int) -> float:
    """TB/s at two transfers a clock of the bus's width."""
    return 2 * memory_clock_mhz * 1e6 * bus_bits / 8 / 1e12


def tensor_tflops(sms: int, sm_clock_mhz: float, capability: str) -> float | None:
    """Dense bf16 TFLOP/s of the tensor cores at their maximum clock; None for an architecture not in the table."""
    per_clock = TENSOR_FLOPS_PER_CLOCK.get(capability)
    return None if per_clock is None else sms * sm_clock_mhz * 1e6 * per_clock / 1e12


def ceilings(peaks: dict) -> tuple[float, float]:
    """What the floor and the percent-of-peak columns divide by: the peak TB/s and TFLOP/s where the
    part gave them, else the measured copy bandwidth and matmul rate."""
    return (peaks.get("datasheet_tbps") or peaks["copy_tbps"],
            peaks.get("datasheet_tflops") or peaks["bf16_matmul_tflops"])


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def with_ceiling(peaks: dict, source: str, memory_clock_mhz=None, bus_bits=None, sms=None, sm_clock_mhz=None,
                 capability=None) -> dict:
    """``peaks`` (the measured rates) with the peak at maximum clocks from the part's numbers, any of which may be
    None where not known (that side then keeps the measured rate), and ``ceiling``: in words, each side's
    number and how it was had, then ``source`` ('from NVML's ...'), where the part's numbers came from or why
    there are none."""
    out = dict(peaks)
    clock, bits = _number(memory_clock_mhz), _number(bus_bits)
    if clock and bits:
        out.update(memory_clock_mhz=clock, memory_bus_bits=int(bits), datasheet_tbps=dram_tbps(clock, bits))
        memory = (f"DRAM {out['datasheet_tbps']:.2f} TB/s = 2 x {clock:.0f} MHz x {bits:.0f} bits / 8 (peak at the "
                  f"maximum memory clock)")
    else:
        memory = f"DRAM: the measured copy's {peaks['copy_tbps']:.2f} TB/s (no memory clock and bus width)"
    count, sm_clock = _number(sms), _number(sm_clock_mhz)
    rate = tensor_tflops(int(count), sm_clock, str(capability)) if count and sm_clock else None
    if rate:
        out.update(sms=int(count), sm_clock_mhz=sm_clock, datasheet_tflops=rate)
        compute = (f"bf16 {rate:.0f} TFLOP/s = {count:.0f} SMs x {sm_clock:.0f} MHz x "
                   f"{TENSOR_FLOPS_PER_CLOCK[str(capability)]} flops per clock per SM (peak at the maximum SM "
                   f"clock, compute capability {capability})")
    else:
        why = f"no tensor-core rate known for compute capability {capability}" if count and sm_clock \
            else "no SM count and clock"
        compute = f"bf16: the measured matmul's {peaks['bf16_matmul_tflops']:.0f} TFLOP/s ({why})"
    out["ceiling"] = f"{memory}; {compute}; {source}"
    return out


def from_meta(meta: dict) -> dict:
    """An older run's peaks with the ceiling, from what its meta.json holds: nvidia-smi's maximum memory and
    SM clocks, the SM count and compute capability, and the bus width of ``BUS_BITS`` for its GPU."""
    gpu = meta.get("gpu")
    bits = BUS_BITS.get(gpu)
    source = (f"from this run's meta.json (nvidia-smi's maximum clocks) and the {bits}-bit bus NVML reports for "
              f"an {gpu}" if bits else f"from this run's meta.json, which has no memory bus width, and none is known "
                                       f"here for GPU {gpu!r}")
    return with_ceiling(meta["peaks"], source, meta.get("nvidia_smi.clocks.max.mem"), bits, meta.get("gpu_sms"),
                        meta.get("nvidia_smi.clocks.max.sm"), meta.get("compute_capability"))
