import sqlite3

import pandas as pd

from swabench import profiling


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
        -- inside the replay range: 4 calls of 10 ns each, and flushes that must not count
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1100, 1110, 1, 5), (1200, 1210, 1, 5), (1300, 1310, 1, 5),
            (1400, 1410, 1, 5), (1500, 1900, 2, 6), (2000, 2400, 2, 6);
        -- outside it (eager): must not count
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (6100, 6500, 1, 5), (6600, 6700, 4, 4);
    """)
    con.commit()
    con.close()


def test_kernels_are_tied_to_their_point(tmp_path):
    fake_report(tmp_path / "r.sqlite")
    table = pd.DataFrame([{"case_id": "abc123", "impl": "paged-window", "backend": "fa2", "case": "c",
                           "median_us": 0.0105, "graph_calls": 2, "repeats": 2}])
    out = profiling.nsys_kernel_table(tmp_path / "r.sqlite", table)
    assert len(out) == 1
    row = out.iloc[0]
    assert row["kernels"] == "BatchPrefillWithPagedKVCacheKernel x1"
    assert abs(row["nsys_kernel_us"] - 0.010) < 1e-12  # 40 ns over 4 calls
    assert abs(row["agreement"] - 0.05) < 1e-9 and row["kernels_per_call"] == 1
    assert abs(row["replay_range_ms"] - 0.004) < 1e-12  # the replay range is 4000 ns


def test_point_names_round_trip():
    assert profiling.parse_point("paged-trim [auto] #0123abcd") == ("0123abcd", "paged-trim", "auto")


def test_nsys_command_traces_graph_nodes():
    cmd = profiling.nsys_command("out/profile", ["run", "quick"])
    assert cmd[:2] == ["nsys", "profile"] and "--cuda-graph-trace=node" in cmd
    assert cmd[-4:] == ["-m", "swabench", "run", "quick"]
