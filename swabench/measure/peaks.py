"""The node's measured ceilings: bf16 matmul rate and device-to-device copy bandwidth.

Percent-of-peak columns divide by these measured numbers, not by datasheet ones."""

from __future__ import annotations

import statistics

import torch

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


def _matmul_tflops(device: torch.device) -> float:
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, generator=g).to(torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, generator=g).to(torch.bfloat16)
    _time_ms(lambda: a @ b, 3)
    return 2 * MATMUL_N ** 3 / (_time_ms(lambda: a @ b, 10) * 1e-3) / 1e12


def _copy_tbps(device: torch.device) -> float:
    src = torch.randint(0, 255, (COPY_BYTES,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    _time_ms(lambda: dst.copy_(src), 3)
    return 2 * COPY_BYTES / (_time_ms(lambda: dst.copy_(src), 10) * 1e-3) / 1e12


def measure(device: torch.device) -> dict:
    """Median of 10 timed runs after 3 warm-ups, on random data (zeros run faster than real data)."""
    return {"bf16_matmul_tflops": _matmul_tflops(device), "copy_tbps": _copy_tbps(device),
            "method": f"bf16 {MATMUL_N}^3 matmul and a {COPY_BYTES >> 30} GiB device copy (bytes read + "
                      f"written), random data, median of 10 after 3 warm-ups, CUDA events"}
