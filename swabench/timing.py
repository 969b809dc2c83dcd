"""Small timing helpers: every sample is kept; summaries are median, IQR and noise (IQR / median).

On a CPU there is no kernel to isolate, so the host timer measures wall clock around a synchronous
call.  (The CUDA-graph timer for GPU kernels lives beside it once the measurement issue lands.)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Timing:
    samples_us: list[float]
    method: str
    warmup: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def iqr_us(self) -> float:
        if len(self.samples_us) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples_us, n=4, method="inclusive")
        return q3 - q1

    @property
    def noise(self) -> float:
        return self.iqr_us / self.median_us if self.median_us > 0 else float("nan")


@dataclass(frozen=True)
class HostTimerOptions:
    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 200
    budget_s: float = 0.2  # stop repeating once this much time was spent (after min_repeats)

    def describe(self) -> str:
        return (f"host wall clock around one synchronous call; {self.warmup} warm-up calls, then repeats "
                f"until {self.min_repeats} samples and {self.budget_s:g} s (at most {self.max_repeats})")


def host_time(fn: Callable[[], None], sync: Callable[[], None] = lambda: None,
              options: HostTimerOptions = HostTimerOptions()) -> Timing:
    """Wall-clock time of ``fn(); sync()`` per call, after warm-up calls that are not recorded."""
    for _ in range(options.warmup):
        fn()
        sync()
    samples, spent = [], 0.0
    while len(samples) < options.max_repeats and (len(samples) < options.min_repeats or spent < options.budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        samples.append(dt * 1e6)
        spent += dt
    return Timing(samples, options.describe(), options.warmup)
