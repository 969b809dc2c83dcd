"""Small timing helpers: every sample is kept; summaries are median, IQR and noise (IQR / median).

- ``host_time``: wall clock around a synchronous call (CPU runs, and plan() everywhere).
- ``cuda_graph_time``: capture k calls in a CUDA graph, replay it, time each replay with CUDA
  events, divide by k.  Cold L2 captures an L2 flush before every call and subtracts a graph of
  the flushes alone, so the flush is not counted.
- ``eager_time``: back-to-back launches timed with events, launch overhead included.

All three repeat until the noise is under a target or a time budget is spent (``sample_until``).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from swabench.measure.markers import nvtx_range


@dataclass
class Timing:
    samples_us: list[float]
    method: str
    extra: dict = field(default_factory=dict)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def iqr_us(self) -> float:
        return iqr(self.samples_us)

    @property
    def noise(self) -> float:
        return self.iqr_us / self.median_us if self.median_us > 0 else float("nan")


def iqr(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q3 - q1


def device_sync(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work: a CUDA synchronize, or nothing on the CPU."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def sample_until(measure: Callable[[], float], min_samples: int, max_samples: int, noise_target: float,
                 budget_s: float, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Call ``measure`` until min_samples are in and either the noise (IQR / median) is at most
    noise_target or budget_s of wall time has passed; never more than max_samples."""
    samples, start = [], clock()
    while len(samples) < max_samples:
        samples.append(measure())
        if len(samples) < min_samples:
            continue
        median = statistics.median(samples)
        if (median > 0 and iqr(samples) / median <= noise_target) or clock() - start >= budget_s:
            break
    return samples


# ---------------------------------------------------------------- host

@dataclass(frozen=True)
class HostTimerOptions:
    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 200
    budget_s: float = 0.2
    noise_target: float = 0.0  # 0: repeat until the budget is spent

    def describe(self) -> str:
        return (f"host wall clock around one synchronous call; {self.warmup} warm-up calls, then repeats "
                f"until {self.min_repeats} samples and {self.budget_s:g} s (at most {self.max_repeats})")


def host_time(fn: Callable[[], None], sync: Callable[[], None] = lambda: None,
              options: HostTimerOptions = HostTimerOptions()) -> Timing:
    """Wall-clock time of ``fn(); sync()`` per call, after warm-up calls that are not recorded."""
    for _ in range(options.warmup):
        fn()
        sync()

    def once() -> float:
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e6

    samples = sample_until(once, options.min_repeats, options.max_repeats, options.noise_target, options.budget_s)
    return Timing(samples, options.describe())


# ---------------------------------------------------------------- CUDA graph

@dataclass(frozen=True)
class GraphTimerOptions:
    l2: str = "cold"  # "cold": flush L2 before every call (not counted); "warm": back-to-back calls
    replay_us: float = 2000.0  # aim for replays this long: k = replay_us / (one call), clamped to [1, max_calls]
    max_calls: int = 200
    min_replays: int = 10
    max_replays: int = 200
    noise_target: float = 0.01
    budget_s: float = 0.3
    eager_calls: int = 20  # per eager sample

    def describe(self) -> str:
        flush = ("an L2 flush captured before every call, its own graph's time subtracted"
                 if self.l2 == "cold" else "calls back to back (warm L2)")
        return (f"CUDA graph of k calls (k sized for ~{self.replay_us:g} us replays, at most {self.max_calls}); "
                f"{flush}; each replay timed with CUDA events and divided by k; replays repeated "
                f"({self.min_replays}..{self.max_replays}, at least 3 when {self.min_replays} would outlast the "
                f"budget) until IQR/median <= {self.noise_target:g} or {self.budget_s:g} s; eager: up to "
                f"{self.eager_calls} back-to-back launches per sample (fewer for calls over "
                f"{self.replay_us / self.eager_calls:g} us) timed with events")

    def counts(self, call_us: float) -> tuple[int, int, int]:
        """(calls per graph, least replays, calls per eager sample) for a call of ``call_us``: about
        replay_us per replay and per eager sample, so a 250 ms call costs a few seconds, not 30."""
        call_us = max(call_us, 1.0)
        k = max(1, min(self.max_calls, math.ceil(self.replay_us / call_us)))
        least = max(3, min(self.min_replays, int(self.budget_s * 1e6 / (k * call_us))))
        eager = max(1, min(self.eager_calls, math.ceil(self.replay_us / call_us)))
        return k, least, eager


@functools.lru_cache(maxsize=None)
def _flush_buffer(device: torch.device) -> torch.Tensor:
    """Twice the L2 size: writing it evicts everything a previous call left in L2."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20)
    return torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)


def capture(body: Callable[[], None], k: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the side-stream warm-up PyTorch asks for before capture
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(k):
            body()
    torch.cuda.synchronize()
    return graph


def _replay_us(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def eager_time(fn: Callable[[], None], calls: int) -> float:
    """Per-call time of ``calls`` launches back to back (launch overhead included), in us."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def cuda_graph_time(fn: Callable[[], None], options: GraphTimerOptions = GraphTimerOptions()) -> tuple[Timing, Timing]:
    """(kernel time per call from graph replays, eager time per call). ``fn`` must be capturable:
    no allocation outside PyTorch's allocator, no host synchronisation."""
    with nvtx_range("capture"):
        fn()
        once = eager_time(fn, 1)
        if once < options.replay_us:  # short calls: a steadier per-call figure, launches overlapped
            once = statistics.median(eager_time(fn, 10) for _ in range(3))
        k, least, eager_calls = options.counts(once)
        if options.l2 == "cold":
            flush = _flush_buffer(torch.device("cuda", torch.cuda.current_device()))
            work = capture(lambda: (flush.zero_(), fn()), k)
            base = capture(flush.zero_, k)

            def sample() -> float:
                return (_replay_us(work) - _replay_us(base)) / k
        else:
            work = capture(fn, k)

            def sample() -> float:
                return _replay_us(work) / k
        sample()  # the first replay uploads the graph: not a sample
    with nvtx_range("replay", payload=k):
        samples = sample_until(sample, least, options.max_replays, options.noise_target, options.budget_s)
    with nvtx_range("eager"):
        eager = sample_until(lambda: eager_time(fn, eager_calls), 3, 20, options.noise_target, 0.2)
    extra = {"graph_calls": k, "replays": len(samples), "l2": options.l2}
    return Timing(samples, options.describe(), extra), Timing(eager, "eager", {"eager_calls": eager_calls})
