import sqlite3

import pandas as pd

from swabench.run import profiling


def fake_report(path):
    """A minimal Nsight Systems export: one point's replay range with its kernels and L2 flushes."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, globalTid INTEGER, text TEXT, textId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, shortName INTEGER, demangledName INTEGER);
        INSERT INTO StringIds VALUES (1, 'BatchPrefillWithPagedKVCacheKernel'), (2, 'vectorized_elementwise_kernel'),
                                     (3, 'case name'), (4, 'other'),
                                     (5, 'void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>(...)'),
                                     (6, 'void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, ...>(...)');
        INSERT INTO NVTX_EVENTS VALUES (0, 10000, 7, 'run quick', NULL), (100, 9000, 7, NULL, 3),
            (200, 8000, 7, 'paged-window [fa2] #abc123', NULL), (1000, 5000, 7, 'replay', NULL),
            (6000, 7000, 7, 'eager', NULL);
        -- inside the replay range, two samples of the cold-L2 timer (graph_calls 2): the timed graph
        -- (flush, call) x 2, then the graph of flushes alone; each call is 10 ns of kernel 10 ns after
        -- its flush, whose 40 ns must not count
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (1000, 1040, 2, 6), (1050, 1060, 1, 5), (1070, 1110, 2, 6), (1120, 1130, 1, 5),
            (1500, 1540, 2, 6), (1550, 1590, 2, 6),
            (2000, 2040, 2, 6), (2050, 2060, 1, 5), (2070, 2110, 2, 6), (2120, 2130, 1, 5),
            (2500, 2540, 2, 6), (2550, 2590, 2, 6);
        -- outside it (eager): must not count
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (6100, 6500, 1, 5), (6600, 6700, 4, 4);
    """)
    con.commit()
    con.close()


def test_kernels_are_tied_to_their_point(tmp_path):
    fake_report(tmp_path / "r.sqlite")
    table = pd.DataFrame([{"case_id": "abc123", "impl": "paged-window", "backend": "fa2", "case": "c",
                           "median_us": 0.021, "graph_calls": 2, "repeats": 2}])
    out = profiling.nsys_kernel_table(tmp_path / "r.sqlite", table)
    assert len(out) == 1
    row = out.iloc[0]
    assert row["kernels"] == "BatchPrefillWithPagedKVCacheKernel x1 0.01 us"
    assert abs(row["nsys_kernel_us"] - 0.010) < 1e-12  # 40 ns of kernels over 4 calls
    assert abs(row["nsys_period_us"] - 0.020) < 1e-12  # and the 10 ns bubble before each
    assert abs(row["agreement"] - 0.05) < 1e-9 and abs(row["busy_agreement"] - 1.1) < 1e-9
    assert row["kernels_per_call"] == 1 and abs(row["gap_us"] - 0.011) < 1e-12
    assert abs(row["replay_range_ms"] - 0.004) < 1e-12  # the replay range is 4000 ns


def test_point_names_round_trip():
    assert profiling.parse_point("paged-trim [auto] #0123abcd") == ("0123abcd", "paged-trim", "auto")


def test_nsys_command_traces_graph_nodes():
    cmd = profiling.nsys_command("out/profile", ["run", "quick"])
    assert cmd[:2] == ["nsys", "profile"] and "--cuda-graph-trace=node" in cmd
    assert cmd[-4:] == ["-m", "swabench", "run", "quick"]


def test_warm_calls_are_timed_start_to_start():
    kernels = pd.DataFrame({"start": [0, 30, 100, 130, 200, 230], "end": [20, 50, 120, 150, 220, 250],
                            "flush": [0] * 6})
    assert profiling.period_per_call_ns(kernels, 2, 3) == 100  # three calls of two kernels, 100 ns apart
    assert profiling.period_per_call_ns(kernels, 2, 1) == 50  # one call a replay: its own span


def test_nsys_times_are_held_against_a_run_without_the_profiler():
    stats = pd.DataFrame([{"case_id": "abc", "impl": "paged-window", "backend": "fa2", "nsys_period_us": 50.0,
                           "agreement": 0.06}])
    run = pd.DataFrame([{"case_id": "abc", "impl": "paged-window", "backend": "fa2", "median_us": 50.5},
                        {"case_id": "abc", "impl": "paged-window", "backend": "fa3", "median_us": 99.0}])
    out = profiling.hold_against(stats, run)
    assert out["graph_unprofiled_us"].tolist() == [50.5] and abs(out["agreement_unprofiled"][0] - 0.01) < 1e-12
