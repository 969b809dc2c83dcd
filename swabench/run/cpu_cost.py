"""What a sweep costs on the CPU before it starts, from its cases' arithmetic (``core.footprint``) and this
machine's pace, measured now: the buffers it fills (a case's build; each point's random fills and probe passes),
every call through the reference and the paths that run here (the gate's passes, then the timer's warm-up and its
repeats until its budget), each call as long as its requests' fixed cost plus the larger of its multiply-adds and
the bytes it writes at the rates measured on this suite's CPU runs.  The pace is measured because a CPU shared with
other work runs PyTorch's small threaded calls many times slower than an idle one, and those calls are most of a
CPU sweep.  The command line says the estimate before such work, so that a user knows."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

# Per CPU thread, measured on 2: PyTorch's bf16 attention (an extend of 2 x 1024 queries on their 1536-key windows,
# 6.4 G multiply-adds in 0.6 s), what SDPA writes widening the keys (decodes and verifies of 1 to 16 k keys through
# torch-mask and torch-trim: 1.0 to 1.7 GB/s), and the elements the gate's fills draw (269 M in 1.5 s).  The float64
# reference takes twice a path's call.
MULTIPLY_ADDS_PER_S = 5e9
BYTES_PER_S = 8e8
FILLS_PER_S = 9e7
REQUEST_S = 1e-4  # a call's fixed cost per request (its gathers, SDPA's threads woken, the copy out), idle
PLAN_REQUEST_S = 5e-5  # a plan's host work per request (its mask and slots), idle
POINT_S = 0.03  # a point's own work outside its calls: the runner made, the row journaled and handed back
PACE_ERROR = 0.1  # each part of the pace is sampled until the standard error of its mean is this fraction of it ...
PACE_BUDGET_S = 1.5  # ... or for this long (a busy machine's calls vary many times over)


@dataclass(frozen=True)
class Pace:
    """How fast this machine runs the suite's CPU calls now, on the threads the sweep will use: a busy machine wakes
    PyTorch's threads many times slower than an idle one, and slows its arithmetic far less."""
    request_s: float  # a call's fixed cost per request: its gathers, SDPA's threads woken, the copy out
    slowdown: float  # its arithmetic's time over what the rates above give (1: as fast)


IDLE = Pace(REQUEST_S, 1.0)


@dataclass(frozen=True)
class CpuCost:
    points: int  # of the sweep's, those that run here (the rest skip before any work)
    multiply_adds: int
    bytes_written: int
    filled: int  # elements drawn into the buffers
    seconds: float
    pace: Pace

    def describe(self, of: int) -> str:
        """'12 of 216 points run on the CPU: ...': what the command line prints before the work."""
        from swabench.core.footprint import human_bytes

        minutes = self.seconds / 60
        took = f"{self.seconds:.0f} s" if minutes < 2 else f"{minutes:.0f} min" if minutes < 120 else \
            f"{minutes / 60:.1f} h"
        busy = self.pace.request_s / REQUEST_S
        said = f"; busy now: PyTorch's small calls take {busy:.0f}x their idle time" if busy >= 3 else ""
        return (f"{self.points} of {of} points run on the CPU: {_count(self.multiply_adds)} multiply-adds, "
                f"{human_bytes(self.bytes_written)} written to memory by the calls, {_count(self.filled)} elements "
                f"filled: about {took} on {torch.get_num_threads()} CPU threads (estimated from the shapes and this "
                f"machine's pace{said})")


def _count(n: float) -> str:
    """3.2e12 -> '3.2 T'."""
    for unit in ("", " k", " M", " G", " T"):
        if n < 1000 or unit == " T":
            return f"{n:.3g}{unit}"
        n /= 1000


def _mean_s(call, least: int) -> float:
    """Mean seconds of ``call`` after one unrecorded call, over at least ``least`` calls and until the mean is known
    to ``PACE_ERROR`` or ``PACE_BUDGET_S`` has passed.  The mean, not the median: the sweep takes the sum of its calls,
    the slow ones included."""
    call()
    took, start = [], time.perf_counter()
    while len(took) < least or (time.perf_counter() - start < PACE_BUDGET_S and
                                statistics.stdev(took) / len(took) ** 0.5 > PACE_ERROR * statistics.fmean(took)):
        t0 = time.perf_counter()
        call()
        took.append(time.perf_counter() - t0)
    return statistics.fmean(took)


def measure_pace() -> Pace:
    """This machine's pace now (about a second idle, a few on a busy machine): a torch-trim decode of four short
    requests, all fixed costs, and an SDPA of 2 G multiply-adds, long enough that waking its threads is a small part
    of it."""
    from swabench.core import workloads
    from swabench.impls import registry
    from swabench.inputs.axes import make_case

    case = make_case(dict(mode="decode", batch_size=4, prefix_len=64, window_left=15, page_size=16, num_qo_heads=4,
                          num_kv_heads=2, head_dim=64, dtype="bfloat16"))
    runner = registry.get("torch-trim").make(workloads.build(case, "cpu"), "torch")
    runner.plan()
    request_s = _mean_s(runner.run, 5) / case.batch_size
    q, kv = torch.randn(8, 512, 64, dtype=torch.bfloat16), torch.randn(4, 4096, 64, dtype=torch.bfloat16)
    sdpa_s = _mean_s(lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True), 3)
    rated = _work_s((2 * 8 * 512 * 4096 * 64, 0))
    return Pace(request_s, sdpa_s / rated)


pace = functools.cache(measure_pace)  # measured once a process: every estimate of a command at the same pace


def _work_s(work: tuple[int, int]) -> float:
    """A call's multiply-adds or its bytes, whichever take longer, on the sweep's threads at the rates above."""
    return max(work[0] / MULTIPLY_ADDS_PER_S, work[1] / BYTES_PER_S) / torch.get_num_threads()


def _call_s(work: tuple[int, int], requests: int, at: Pace) -> float:
    """One call's seconds at the pace ``at``: its requests' fixed cost, then its work."""
    return requests * at.request_s + _work_s(work) * at.slowdown


def _timer_s(call: float, timer) -> float:
    """What a host timer spends on a call of ``call`` seconds: its warm-up, then repeats until its least count
    and its budget (at most its most repeats)."""
    return timer.warmup * call + max(timer.min_repeats * call, min(timer.budget_s, timer.max_repeats * call))


def estimate(points, device: torch.device, timed: bool = True, at: Pace | None = None) -> CpuCost:
    """The cost of ``points`` on ``device`` (the CPU) at the pace ``at`` (this machine's now, by default), the points
    that cannot run here (the library, or the memory free now) left out."""
    from swabench.core import footprint, probes
    from swabench.impls import registry
    from swabench.measure import timing
    from swabench.run import memory, sweep

    host, at = timing.HostTimerOptions(), at or pace()
    run = macs = written = filled = 0
    seconds = 0.0
    for case, mine in sweep.points_by_case(points).items():
        here = [] if memory.too_big(case, device) else \
            [p for p in mine if not registry.get(p.impl).skip_reason(case, p.backend, device)]
        here = [p for p in here if not memory.call_too_big(p, device)]
        if not here:
            continue
        passes = 1 + probes.passes(case.num_qo_heads, case.window_left, case.attention_chunk, case.tree is not None,
                                   case.block)
        requests = case.batch_size
        # the build; each point's random fills (before and after its gate) and probe passes
        fills = footprint.buffer_elements(case) * (1 + len(here) * (1 + passes))
        reference = footprint.call_work(case, "torch")
        calls = [(2 * passes, reference)]  # the reference, once a pass, in float64: twice a path's call
        seconds += 2 * passes * _call_s(reference, requests, at) + fills / FILLS_PER_S * at.slowdown
        for p in here:
            impl = registry.get(p.impl)
            times = timed and (not impl.expected_to_fail or impl.timed_where_exact)
            work = footprint.call_work(case, impl.library, impl.baseline)
            call = _call_s(work, requests, at)
            seconds += POINT_S + passes * call
            if times:
                plan = requests * PLAN_REQUEST_S * at.request_s / REQUEST_S
                seconds += _timer_s(call, host) + _timer_s(plan, sweep.PLAN_TIMER)
            calls.append((passes + (host.warmup + host.min_repeats if times else 0), work))
        run, filled = run + len(here), filled + fills
        macs, written = macs + sum(n * w[0] for n, w in calls), written + sum(n * w[1] for n, w in calls)
    return CpuCost(run, macs, written, filled, seconds, at)
