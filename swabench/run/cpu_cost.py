"""What a sweep costs on the CPU before it starts, from its cases' arithmetic alone (``core.footprint``): the
buffers it fills (a case's build; each point's random fills and probe passes), and the multiply-adds and the bytes
of every call through the reference and the paths that run here (the gate's passes, then the timed calls), at
rates measured on this suite's CPU runs.  The command line says it before such work, so that a user knows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# per CPU thread: the gate's float64 reference and PyTorch's bf16 attention alike (an extend step of gemma-3-1b,
# 4 x 2048 queries on 10240 keys, gated by torch-trim on 2 threads: 687 G multiply-adds in 164 s)
MULTIPLY_ADDS_PER_S = 2e9
# per CPU thread: what SDPA writes widening the keys (torch-mask on 32 decodes of 4096 to 16384 keys, 32 heads:
# 31 GB a call, 10 s on 2 threads), and elements drawn into the buffers (a 1.5 G element cache built in 10 s)
BYTES_PER_S = 1.5e9
FILLS_PER_S = 8e7


@dataclass(frozen=True)
class CpuCost:
    points: int  # of the sweep's, those that run here (the rest skip before any work)
    multiply_adds: int
    bytes_written: int
    filled: int  # elements drawn into the buffers
    timed_s: float  # the timers' least time per timed point, whatever a call costs
    threads: int

    @property
    def seconds(self) -> float:
        per_thread = (self.multiply_adds / MULTIPLY_ADDS_PER_S + self.bytes_written / BYTES_PER_S
                      + self.filled / FILLS_PER_S)
        return per_thread / self.threads + self.timed_s

    def describe(self, of: int) -> str:
        """'12 of 216 points run on the CPU: ...': what the command line prints before the work."""
        from swabench.core.footprint import human_bytes

        minutes = self.seconds / 60
        took = f"{self.seconds:.0f} s" if minutes < 2 else f"{minutes:.0f} min" if minutes < 120 else \
            f"{minutes / 60:.1f} h"
        return (f"{self.points} of {of} points run on the CPU: {_count(self.multiply_adds)} multiply-adds, "
                f"{human_bytes(self.bytes_written)} written to memory by the calls, {_count(self.filled)} elements "
                f"filled: about {took} on {self.threads} CPU threads (estimated from the shapes)")


def _count(n: float) -> str:
    """3.2e12 -> '3.2 T'."""
    for unit in ("", " k", " M", " G", " T"):
        if n < 1000 or unit == " T":
            return f"{n:.3g}{unit}"
        n /= 1000


def estimate(points, device: torch.device, timed: bool = True) -> CpuCost:
    """The cost of ``points`` on ``device`` (the CPU), the points that cannot run here (the library, or the memory
    free now) left out."""
    from swabench.core import footprint, probes
    from swabench.impls import registry
    from swabench.measure import timing
    from swabench.run import memory, sweep

    host, by_case = timing.HostTimerOptions(), sweep.points_by_case(points)
    run = macs = written = filled = timed_points = 0
    for case, mine in by_case.items():
        here = [] if memory.too_big(case, device) else \
            [p for p in mine if not registry.get(p.impl).skip_reason(case, p.backend, device)]
        here = [p for p in here if not memory.call_too_big(p, device)]
        if not here:
            continue
        passes = 1 + probes.passes(case.num_qo_heads, case.window_left, case.attention_chunk, case.tree is not None,
                                   case.block)
        filled += footprint.buffer_elements(case) * (1 + len(here) * 2 * passes)  # the build; each point's random
        # fills (before and after its gate) and probe passes (the values drawn, keys and values written)
        ref = footprint.call_work(case, "torch")  # the reference, once a pass
        macs, written = macs + passes * ref[0], written + passes * ref[1]
        for p in here:
            impl = registry.get(p.impl)
            times = timed and (not impl.expected_to_fail or impl.timed_where_exact)
            calls = passes + (host.warmup + host.min_repeats if times else 0)
            work = footprint.call_work(case, impl.library, impl.baseline)
            macs, written, timed_points = macs + calls * work[0], written + calls * work[1], timed_points + times
        run += len(here)
    budget = host.budget_s + sweep.PLAN_TIMER.budget_s
    return CpuCost(run, macs, written, filled, timed_points * budget, torch.get_num_threads())
