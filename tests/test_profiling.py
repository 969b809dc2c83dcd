import sqlite3

import pandas as pd
import pytest

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



def profiled_folder(path, nsys=True):
    """A run folder of three decode cases (ids of digits, as a case_id can be) through the reference path and
    FlexAttention, two at serving sizes, with the kernels Nsight Systems saw when ``nsys``."""
    import json

    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"scenario": "peers", "format_version": 6}))
    rows = [dict(case_id=c, case=f"decode {c}", impl=i, backend=b, library=lib, kind="correct", status="pass",
                 mode="decode", storage="paged", batch_size=batch, prefix_len=8192, median_us=us)
            for c, (batch, fa2, flex) in {"0102": (64, 10.0, 40.0), "0101": (64, 20.0, 30.0),
                                          "0103": (8, 1.0, 50.0)}.items()
            for i, b, lib, us in [("flex-window", "flex", "flex", flex), ("paged-window", "fa2", "flashinfer", fa2)]]
    pd.DataFrame(rows).to_csv(path / "results.csv", index=False)
    if nsys:
        stats = pd.DataFrame([dict(case_id=r["case_id"], case=r["case"], impl=r["impl"], backend=r["backend"],
                                   kernels=f"k_{r['impl']} x1 {r['median_us'] / 2:.3g} us",
                                   nsys_kernel_us=r["median_us"] / 2) for r in rows[:4]])
        stats.to_csv(path / "nsys_stats.csv", index=False)
    return path


def test_a_profiled_run_shows_its_kernels_against_the_reference(tmp_path):
    from swabench.publish import findings
    from swabench.publish.sections import by_key

    profiled, plain = findings.load([profiled_folder(tmp_path / "p"), profiled_folder(tmp_path / "r", nsys=False)])
    assert profiled.profiled and not plain.profiled
    kernels = by_key("kernels")
    table = kernels.table(profiled)
    assert table["case"].tolist() == ["decode 0102"] * 2 + ["decode 0101"] * 2  # the run's order, ids kept as text
    assert table["path"].tolist() == ["paged-window [fa2]", "flex-window [flex]"] * 2
    assert table["its time / the reference path's"].tolist() == ["1.00", "4.00", "1.00", "1.50"]
    assert table["kernels (launches, busy us a call)"].iloc[1] == "k_flex-window x1 20 us"
    assert kernels.said(profiled) == [f"- `flex-window` [flex]: its kernels take 1.50 to 4.00 times the reference's "
                                      f"busy time over 2 points (`{tmp_path / 'p'}`)."]
    assert kernels.table(plain).empty


@pytest.mark.parametrize("text", ["\n", "case_id,case,impl,backend,kernels,nsys_kernel_us\n"])
def test_a_profile_that_tied_no_kernel_to_a_point_has_no_kernels_table(tmp_path, text):
    from swabench.publish import findings
    from swabench.publish.sections import by_key

    (profiled_folder(tmp_path / "p") / "nsys_stats.csv").write_text(text)
    assert by_key("kernels").for_runs(findings.load([tmp_path / "p"])) == []


def test_the_findings_page_keeps_a_profiled_run_to_its_kernels_runs_and_correctness(tmp_path):
    from swabench.publish import findings
    from swabench.publish.sections import by_key

    profiled, plain = findings.load([profiled_folder(tmp_path / "p"), profiled_folder(tmp_path / "r", nsys=False)])
    page = findings.page([profiled, plain])
    kernels, peers = page.split("## Under Nsight Systems")[1], page.split("## Peers:")[1].split("\n## ")[0]
    assert profiled.name in kernels and profiled.name not in peers and plain.name in peers
    assert f"- {profiled.name}: run of scenario `peers` made under a profiler" in page
    answer = page.split("**The other libraries at serving sizes**")[1].split("\n\n")[0]
    assert f"its median: `flex-window` 2 of 2, 2.75x ({plain.name})." in answer
    assert by_key("peers").for_run(profiled)  # its own report keeps its timed tables
    (tmp_path / "p" / "nsys_stats.csv").unlink()
    (tmp_path / "p" / "torch_stats.txt").write_text("table\n")
    assert findings.load([tmp_path / "p"])[0].profiled  # torch.profiler's run too


def test_an_older_profiled_folder_names_its_kernels_as_its_table_does(tmp_path):
    """Before result format 6 flex-window was the flattened peer: its kernel rows read as flex-flat, like its table."""
    import json

    from swabench.publish import findings
    from swabench.publish.sections import by_key

    folder = profiled_folder(tmp_path / "p")
    (folder / "meta.json").write_text(json.dumps({"scenario": "peers", "format_version": 5}))
    table = by_key("kernels").table(findings.load([folder])[0])
    assert table["path"].tolist() == ["paged-window [fa2]", "flex-flat [flex]"] * 2
