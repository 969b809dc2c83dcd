"""The node's ceilings: the part's peak at its maximum clocks (``measure.ceiling``, from NVML's clocks and memory bus
width), which no kernel beats and the floor divides by, and beside it what a kernel can attain, measured on
the node: a bf16 matmul rate, a device-to-device copy bandwidth and a read-only stream's bandwidth."""

from __future__ import annotations

import statistics

import torch

from swabench.measure import ceiling, clocks

MATMUL_N = 8192
COPY_BYTES = 2 << 30


def _time_ms(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rate(fn, units: float) -> float:
    """``units`` / the median of 10 timed calls after 3 warm-ups, per second, in tera."""
    _time_ms(fn, 3)
    return units / (_time_ms(fn, 10) * 1e-3) / 1e12


def _matmul_tflops(device: torch.device) -> float:
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, generator=g).to(torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, generator=g).to(torch.bfloat16)
    return _rate(lambda: a @ b, 2 * MATMUL_N ** 3)


def _copy_tbps(device: torch.device) -> float:
    src = torch.randint(0, 255, (COPY_BYTES,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _rate(lambda: dst.copy_(src), 2 * COPY_BYTES)


def _read_tbps(device: torch.device) -> float:
    """A read-only stream: the sum of a float32 tensor, which reads every byte once and writes one number."""
    src = torch.randn(COPY_BYTES // 4, device=device, generator=torch.Generator(device=device).manual_seed(0))
    return _rate(src.sum, COPY_BYTES)


def measure(device: torch.device) -> dict:
    """The measured rates (random data: zeros run faster than real data) and the peak at maximum clocks from
    NVML (the measured rates where NVML cannot be read, said in ``ceiling``)."""
    measured = {"bf16_matmul_tflops": _matmul_tflops(device), "copy_tbps": _copy_tbps(device),
                "read_tbps": _read_tbps(device),
                "method": f"bf16 {MATMUL_N}^3 matmul, a {COPY_BYTES >> 30} GiB device copy (bytes read + written) "
                          f"and the sum of {COPY_BYTES >> 30} GiB of float32 (bytes read), random data, median of "
                          f"10 after 3 warm-ups, CUDA events"}
    maxima, source = clocks.maxima(device)
    props = torch.cuda.get_device_properties(device)
    return ceiling.with_ceiling(measured, source, maxima.get("memory_clock_mhz"), maxima.get("memory_bus_bits"),
                                props.multi_processor_count, maxima.get("sm_clock_mhz"),
                                f"{props.major}.{props.minor}")
