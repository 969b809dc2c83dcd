"""What a sweep costs on the CPU before it starts, from its cases' arithmetic alone (``core.footprint``): the
buffers it fills (a case's build; each point's random fills and probe passes), and every call through the reference
and the paths that run here (the gate's passes, then the timed calls), each as long as the larger of its
multiply-adds and the bytes it writes take, at rates measured on this suite's CPU runs.  The command line says it
before such work, so that a user knows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Per CPU thread, measured on 2: PyTorch's bf16 attention (an extend of 2 x 1024 queries on their 1536-key windows,
# 6.4 G multiply-adds in 0.6 s), what SDPA writes widening the keys (decodes and verifies of 1 to 16 k keys through
# torch-mask and torch-trim: 1.0 to 1.7 GB/s), and the elements the gate's fills draw (269 M in 1.5 s).  The float64
# reference takes twice a path's call.
MULTIPLY_ADDS_PER_S = 5e9
BYTES_PER_S = 8e8
FILLS_PER_S = 9e7


@dataclass(frozen=True)
class CpuCost:
    points: int  # of the sweep's, those that run here (the rest skip before any work)
    multiply_adds: int
    bytes_written: int
    filled: int  # elements drawn into the buffers
    seconds: float

    def describe(self, of: int) -> str:
        """'12 of 216 points run on the CPU: ...': what the command line prints before the work."""
        from swabench.core.footprint import human_bytes

        minutes = self.seconds / 60
        took = f"{self.seconds:.0f} s" if minutes < 2 else f"{minutes:.0f} min" if minutes < 120 else \
            f"{minutes / 60:.1f} h"
        return (f"{self.points} of {of} points run on the CPU: {_count(self.multiply_adds)} multiply-adds, "
                f"{human_bytes(self.bytes_written)} written to memory by the calls, {_count(self.filled)} elements "
                f"filled: about {took} on {torch.get_num_threads()} CPU threads (estimated from the shapes)")


def _count(n: float) -> str:
    """3.2e12 -> '3.2 T'."""
    for unit in ("", " k", " M", " G", " T"):
        if n < 1000 or unit == " T":
            return f"{n:.3g}{unit}"
        n /= 1000


def _call_s(work: tuple[int, int]) -> float:
    """One call's seconds on one thread: its multiply-adds or its bytes, whichever take longer."""
    return max(work[0] / MULTIPLY_ADDS_PER_S, work[1] / BYTES_PER_S)


def estimate(points, device: torch.device, timed: bool = True) -> CpuCost:
    """The cost of ``points`` on ``device`` (the CPU), the points that cannot run here (the library, or the memory
    free now) left out."""
    from swabench.core import footprint, probes
    from swabench.impls import registry
    from swabench.measure import timing
    from swabench.run import memory, sweep

    host = timing.HostTimerOptions()
    run = macs = written = filled = 0
    seconds = 0.0  # on one thread
    for case, mine in sweep.points_by_case(points).items():
        here = [] if memory.too_big(case, device) else \
            [p for p in mine if not registry.get(p.impl).skip_reason(case, p.backend, device)]
        here = [p for p in here if not memory.call_too_big(p, device)]
        if not here:
            continue
        passes = 1 + probes.passes(case.num_qo_heads, case.window_left, case.attention_chunk, case.tree is not None,
                                   case.block)
        # the build; each point's random fills (before and after its gate) and probe passes
        fills = footprint.buffer_elements(case) * (1 + len(here) * (1 + passes))
        calls = [(2 * passes, footprint.call_work(case, "torch"))]  # the reference, once a pass, in float64
        for p in here:
            impl = registry.get(p.impl)
            times = timed and (not impl.expected_to_fail or impl.timed_where_exact)
            calls.append((passes + (host.warmup + host.min_repeats if times else 0),
                          footprint.call_work(case, impl.library, impl.baseline)))
            seconds += (host.budget_s + sweep.PLAN_TIMER.budget_s) * torch.get_num_threads() if times else 0
        run, filled = run + len(here), filled + fills
        macs, written = macs + sum(n * w[0] for n, w in calls), written + sum(n * w[1] for n, w in calls)
        seconds += fills / FILLS_PER_S + sum(n * _call_s(w) for n, w in calls)
    return CpuCost(run, macs, written, filled, seconds / torch.get_num_threads())
