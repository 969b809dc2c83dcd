import itertools

import pandas as pd
import pytest

from swabench.analysis import derived
from swabench.measure import timing


def test_sample_until_stops_when_quiet():
    values = iter([10.0] * 100)
    samples = timing.sample_until(lambda: next(values), 5, 100, 0.02, budget_s=1e9)
    assert len(samples) == 5  # constant samples: noise 0 as soon as the minimum is in


def test_sample_until_stops_at_the_budget_or_the_cap():
    noisy = itertools.cycle([1.0, 5.0, 9.0])
    ticks = itertools.count()
    samples = timing.sample_until(lambda: next(noisy), 3, 1000, 0.01, budget_s=10, clock=lambda: next(ticks))
    assert 3 <= len(samples) <= 12  # the fake clock advances one second per check
    assert len(timing.sample_until(lambda: next(noisy), 3, 7, 0.0, budget_s=1e9)) == 7


def test_timing_summary():
    t = timing.Timing([1.0, 2.0, 3.0, 4.0, 100.0], "m")
    assert t.median_us == 3.0 and t.iqr_us == 2.0 and abs(t.noise - 2 / 3) < 1e-12


def test_host_timer_keeps_every_sample():
    calls = []
    t = timing.host_time(lambda: calls.append(1), options=timing.HostTimerOptions(warmup=2, min_repeats=4,
                                                                                   max_repeats=4, budget_s=0))
    assert len(calls) == 6 and len(t.samples_us) == 4 and all(s >= 0 for s in t.samples_us)


def test_speedup_over_the_mask_baseline_and_percent_of_peaks():
    rows = [dict(case_id="a", impl="paged-window", backend="fa3", library="flashinfer", storage="paged",
                 median_us=10.0, tflops=100.0, tbps=1.0),
            dict(case_id="a", impl="paged-mask", backend="fa2", library="flashinfer", storage="paged",
                 median_us=50.0, tflops=20.0, tbps=0.2),
            dict(case_id="a", impl="torch-trim", backend="torch", library="torch", storage="paged",
                 median_us=30.0, tflops=1.0, tbps=0.1),
            dict(case_id="a", impl="torch-mask", backend="torch", library="torch", storage="paged",
                 median_us=60.0, tflops=0.5, tbps=0.05)]
    table = derived.add_derived(pd.DataFrame(rows), {"bf16_matmul_tflops": 800.0, "copy_tbps": 4.0})
    # fa3 has no masks: the fa2 mask row of the same case is the baseline
    assert list(table["speedup_vs_mask"]) == [5.0, 1.0, 2.0, 1.0]
    assert list(table["pct_peak_tflops"]) == [12.5, 2.5, 0.125, 0.0625]
    assert table["pct_peak_tbps"].iloc[0] == 25.0


@pytest.mark.parametrize("call_us,expect", [
    (5.0, (200, 10, 20)),        # short: the graph holds max_calls, ten replays at least, 20 eager launches
    (100.0, (20, 10, 20)),       # ~2 ms replays
    (3000.0, (1, 10, 1)),        # one call per replay; ten replays of 3 ms fit the 0.3 s budget
    (250_000.0, (1, 3, 1)),      # a 250 ms call: three replays, not ten (the budget buys one)
])
def test_graph_timer_sizes_its_work_by_the_call(call_us, expect):
    assert timing.GraphTimerOptions().counts(call_us) == expect
    k, least, eager = expect
    assert k * call_us * least <= 0.3e6 or least == 3
