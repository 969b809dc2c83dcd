import gzip
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from swabench.analysis import derived
from swabench.store import run_folder
from swabench.store.run_folder import RunFolderError, RunStore


def row(i, **kw):
    return {"case_id": f"c{i}", "impl": "torch-trim", "backend": "torch", "status": "pass",
            "median_us": i + 0.5, "samples": {"kernel": [1.0, 2.0, float(i)]}, **kw}  # a timed median is > 0


def test_rows_survive_and_finalize_writes_tidy_tables(tmp_path):
    store = RunStore.create(tmp_path / "run", {"gpu": None}, "name = 'x'\n")
    for i in range(3):
        store.append(row(i))
    table = store.finalize(state="complete")
    assert list(table["case_id"]) == ["c0", "c1", "c2"] and "samples" not in table
    assert table.columns[0] == "case_id"
    samples = derived.load(tmp_path / "run")[0]
    assert len(samples) == 3
    long = gzip.decompress((tmp_path / "run" / "samples.csv.gz").read_bytes()).decode().splitlines()
    assert long[0] == "case_id,impl,backend,kind,index,value_us" and len(long) == 1 + 9
    assert not (tmp_path / "run" / "samples.csv").exists()
    meta = json.loads((tmp_path / "run" / run_folder.META).read_text())
    assert meta["state"] == "complete" and meta["rows"] == 3 and meta["status_counts"] == {"pass": 3}


def test_the_same_rows_give_the_same_gzipped_bytes(tmp_path):
    written = []
    for name in ("a", "b"):
        store = RunStore.create(tmp_path / name, {"gpu": None}, "name = 'x'\n")
        store.extend([row(i) for i in range(3)])
        store.finalize(state="complete")
        written.append((tmp_path / name / "samples.csv.gz").read_bytes())
    assert written[0] == written[1]
    assert written[0][4:8] == b"\0\0\0\0"  # no time in the gzip header


def test_finalize_replaces_a_plain_samples_file_left_by_an_older_version(tmp_path):
    store = RunStore.create(tmp_path / "run", {"gpu": None}, "name = 'x'\n")
    store.append(row(1))
    (tmp_path / "run" / "samples.csv").write_text("case_id,impl,backend,kind,index,value_us\n")
    store.finalize(state="complete")
    assert not (tmp_path / "run" / "samples.csv").exists()
    assert run_folder.read_rows(tmp_path / "run")[0]["samples"] == {"kernel": [1.0, 2.0, 1.0]}


H200_RUN = Path(__file__).parent / "fixtures" / "h200-run"  # published before samples.csv.gz: plain tables


def test_folders_with_plain_or_gzipped_tables_read_the_same(tmp_path):
    assert (H200_RUN / "samples.csv").exists() and not (H200_RUN / "samples.csv.gz").exists()
    plain_rows = run_folder.read_rows(H200_RUN)
    plain_table = derived.load(H200_RUN)[0]
    assert sum(len(v) for r in plain_rows for v in r["samples"].values()) > 0
    packed = shutil.copytree(H200_RUN, tmp_path / "packed")
    for name in ("results.csv", "samples.csv"):
        (packed / f"{name}.gz").write_bytes(run_folder.gzipped((packed / name).read_text()))
        (packed / name).unlink()
    assert run_folder.read_rows(packed) == plain_rows
    assert derived.load(packed)[0].equals(plain_table)


def test_a_damaged_gzipped_table_is_refused_by_name(tmp_path):
    folder = shutil.copytree(H200_RUN, tmp_path / "cut")
    data = run_folder.gzipped((folder / "results.csv").read_text())
    (folder / "results.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(RunFolderError, match=r"results\.csv\.gz cannot be read"):
        run_folder.load(folder)


def test_two_copies_of_a_table_are_read_when_they_agree_and_refused_when_they_differ(tmp_path):
    folder = shutil.copytree(H200_RUN, tmp_path / "both")
    (folder / "results.csv.gz").write_bytes(run_folder.gzipped((folder / "results.csv").read_text()))
    assert run_folder.load(folder)[0].equals(run_folder.load(H200_RUN)[0])
    lines = (folder / "results.csv").read_text().splitlines(keepends=True)
    (folder / "results.csv").write_text("".join(lines[:-1]))  # the plain copy lost a point
    with pytest.raises(RunFolderError, match=rf"{folder} has both results\.csv and results\.csv\.gz and they differ"):
        run_folder.load(folder)
    (folder / "samples.csv.gz").write_bytes(run_folder.gzipped("case_id,impl,backend,kind,index,value_us\n"))
    (folder / "results.csv.gz").unlink()
    with pytest.raises(RunFolderError, match=r"has both samples\.csv and samples\.csv\.gz and they differ"):
        run_folder.read_rows(folder)


def test_finalize_drops_a_gzipped_table_it_replaces(tmp_path):
    store = RunStore.create(tmp_path / "run", {"gpu": None}, "name = 'x'\n")
    store.append(row(1))
    (tmp_path / "run" / "results.csv.gz").write_bytes(run_folder.gzipped("case_id,impl,backend,status\n"))
    store.finalize(state="complete")
    assert not (tmp_path / "run" / "results.csv.gz").exists() and len(run_folder.load(tmp_path / "run")[0]) == 1


def finished(folder, n=3):
    store = RunStore.create(folder, {"gpu": None}, "name = 'x'\n")
    store.extend([row(i) for i in range(n)])
    store.finalize(state="complete")
    return store


def test_a_journal_and_a_table_that_disagree_are_refused(tmp_path):
    store = finished(tmp_path / "run")
    table = (tmp_path / "run" / "results.csv").read_text()
    (tmp_path / "run" / "results.csv").write_text(table.replace(",2.5,", ",20.5,"))  # c2's median edited
    for read in (run_folder.load, run_folder.read_rows):
        with pytest.raises(RunFolderError, match=r"run: rows\.jsonl and results\.csv disagree \(1 points a different "
                                                 r"status or median_us, e\.g\. c2, torch-trim, torch\)"):
            read(tmp_path / "run")
    (tmp_path / "run" / "results.csv").write_text(table)
    store.append(row(7))  # a point after the table was written, in a run said complete
    with pytest.raises(RunFolderError, match=r"1 points in rows\.jsonl only, e\.g\. c7"):
        run_folder.load(tmp_path / "run")
    store.update_meta(state="running")  # a resumed sweep's journal runs ahead of its last table
    assert len(run_folder.load(tmp_path / "run")[0]) == 4
    (tmp_path / "run" / "rows.jsonl").write_text("")
    with pytest.raises(RunFolderError, match=r"3 points in results\.csv only"):
        run_folder.read_rows(tmp_path / "run")


@pytest.mark.parametrize("value, timer, match", [
    ("", "cuda-graph", r"line 2, column value_us: nan is not allowed \(a finite number\)"),
    ("nan", "cuda-graph", r"line 2, column value_us: nan is not allowed \(a finite number\)"),
    ("-3.5", "host", r"point case_id c0, impl torch-trim, backend torch: kernel sample 0: -3.5 is not allowed "
                     r"\(a number >= 0"),
])
def test_a_sample_that_is_no_time_is_refused_by_file_and_point(tmp_path, value, timer, match):
    finished(tmp_path / "run", n=1)
    import pandas as pd
    published = tmp_path / "run"
    (published / "rows.jsonl").unlink()
    df = pd.read_csv(published / "results.csv")
    df["timer"], df["l2"] = timer, "cold"
    df.to_csv(published / "results.csv", index=False)
    samples = pd.read_csv(published / "samples.csv.gz")
    samples["value_us"] = samples["value_us"].astype(object)
    samples.loc[0, "value_us"] = value
    (published / "samples.csv.gz").write_bytes(run_folder.gzipped(samples.to_csv(index=False)))
    with pytest.raises(RunFolderError, match=rf"samples\.csv\.gz: {match}"):
        run_folder.read_rows(published)


def test_only_a_cold_graph_kernel_sample_may_be_negative(tmp_path):
    """A cold-L2 replay less the flush's replay is a difference: noise can take one sample below zero."""
    store = RunStore.create(tmp_path / "run", {"gpu": None}, "name = 'x'\n")
    store.append(row(1, timer="cuda-graph", l2="cold", samples={"kernel": [-4.0, 9.0, 10.0], "plan": [3.0]}))
    store.append(row(2, timer="cuda-graph", l2="warm", samples={"kernel": [-4.0, 9.0, 10.0]}))
    with pytest.raises(RunFolderError, match=r"rows\.jsonl: line 2: point case_id c2.*kernel sample 0: -4\.0"):
        run_folder.read_rows(tmp_path / "run")
    store.append(row(2, timer="cuda-graph", l2="cold", samples={"kernel": [1.0], "plan": [-1.0]}))
    with pytest.raises(RunFolderError, match=r"point case_id c2.*plan sample 0: -1\.0"):
        run_folder.read_rows(tmp_path / "run")
    store.append(row(2, timer="cuda-graph", l2="cold", samples={"kernel": [float("nan")]}))
    with pytest.raises(RunFolderError, match=r"kernel sample 0: nan is not allowed \(a finite number\)"):
        run_folder.read_rows(tmp_path / "run")
    store.append(row(2, timer="cuda-graph", l2="cold"))
    assert [r["samples"]["kernel"][0] for r in run_folder.read_rows(tmp_path / "run")] == [-4.0, 1.0]


def test_create_refuses_an_existing_run(tmp_path):
    RunStore.create(tmp_path / "run", {}, "a")
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with pytest.raises(RunFolderError, match="already holds a run"):
        RunStore.create(tmp_path / "run", {}, "a")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_resume_drops_a_half_written_line_and_checks_the_scenario(tmp_path):
    store = RunStore.create(tmp_path / "run", {}, "scenario text")
    store.append(row(0))
    with open(tmp_path / "run" / run_folder.ROWS, "a") as f:
        f.write('{"case_id": "c1", "impl": "torch-tr')  # interrupted mid-write
    assert store.done() == {("c0", "torch-trim", "torch")}
    with pytest.raises(RunFolderError, match="different scenario"):
        RunStore.resume(tmp_path / "run", "other text")
    with pytest.raises(RunFolderError, match=f"being written by another swabench process .pid {os.getpid()}"):
        RunStore.resume(tmp_path / "run", "scenario text")  # the first store still holds it
    store.close()
    resumed = RunStore.resume(tmp_path / "run", "scenario text")
    resumed.append(row(1))
    assert resumed.done() == {("c0", "torch-trim", "torch"), ("c1", "torch-trim", "torch")}
    assert all(json.loads(line) for line in (tmp_path / "run" / run_folder.ROWS).read_text().splitlines())


def test_resume_needs_a_run_folder(tmp_path):
    with pytest.raises(RunFolderError, match="not a swabench run folder"):
        RunStore.resume(tmp_path, "x")


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    run_folder.atomic_write(tmp_path / "f.csv", "a,b\n")
    run_folder.atomic_write(tmp_path / "f.csv", "a,b\n1,2\n")
    assert [p.name for p in tmp_path.iterdir()] == ["f.csv"]
    assert (tmp_path / "f.csv").read_text() == "a,b\n1,2\n"


def test_commit_sent_with_the_checkout_wins_over_its_git(monkeypatch):
    """A copy on a GPU node may carry a stale .git; the commit its sender names is the one recorded."""
    from swabench.run import environment
    monkeypatch.delenv("SWABENCH_GIT_COMMIT", raising=False)
    own = environment.git_state()
    monkeypatch.setenv("SWABENCH_GIT_COMMIT", "0123abcd" * 5)
    sent = environment.git_state()
    assert sent["git_commit"] == "0123abcd" * 5 and sent["git_commit_from"] == "SWABENCH_GIT_COMMIT"
    assert own.get("git_commit_from") is None


def test_meta_keys_are_defined_in_the_schema_and_versioned(tmp_path):
    from swabench.store import schema
    store = RunStore.create(tmp_path / "run", {"scenario": "x"}, "a")
    assert store.meta()["format_version"] == schema.FORMAT_VERSION
    with pytest.raises(ValueError, match="not defined in swabench.store.schema: jit_warmup_s"):
        store.update_meta(jit_warmup_s={})
    (tmp_path / "run" / run_folder.META).write_text(json.dumps({**store.meta(), "note": "added by hand"}))
    assert store.update_meta(state="complete")["note"] == "added by hand"


def test_folders_of_the_first_format_read_as_the_current_one(tmp_path):
    from swabench.store import schema
    (tmp_path / run_folder.META).write_text(json.dumps({"scenario": "old", "jit_warmup_s": {"a": 1.0},
                                                     "jit_warmup_total_s": 1.0}))
    meta = run_folder.read_meta(tmp_path)
    assert meta["format_version"] == schema.FORMAT_VERSION and "jit_warmup_s" not in meta
    assert meta["jit_warmups"] == [{"jit_warmup_s": {"a": 1.0}, "jit_warmup_wall_s": 1.0}]
    (tmp_path / run_folder.META).write_text(json.dumps({"format_version": schema.FORMAT_VERSION + 1}))
    with pytest.raises(RunFolderError, match="newer than this swabench reads"):
        run_folder.read_meta(tmp_path)


def test_a_table_from_before_the_wrapper_mode_axis_keeps_its_layouts_apart_from_the_axis():
    from swabench.store import schema
    old = pd.DataFrame({"impl": ["paged-window", "flex-window"], "wrapper": ["prefill", "flex"],
                        "wrapper_mode": ["cuda-graph, uniform_q_len=4", "batch 3 x 1 queries"]})
    table = schema.migrate_table(old)
    assert table["layout"].tolist() == old["wrapper_mode"].tolist() and (table["wrapper_mode"] == "cuda-graph").all()
    assert table["wrapper"].tolist() == ["prefill", "flex"]
    new = pd.DataFrame({"impl": ["paged-window"], "wrapper_mode": ["plain"], "layout": ["plain"]})
    assert schema.migrate_table(new.copy())[list(new.columns)].equals(new)
    # a folder resumed across the change: its old rows described in wrapper_mode, its new rows with a layout
    resumed = pd.DataFrame({"impl": ["flex-window", "torch-trim", "paged-window"],
                            "wrapper_mode": ["batch 1 x 1 queries", None, "plain"], "layout": [None, None, "plain"]})
    table = schema.migrate_table(resumed)
    assert table["wrapper_mode"].tolist() == ["cuda-graph", "cuda-graph", "plain"]
    assert table["layout"].tolist()[::2] == ["batch 1 x 1 queries", "plain"] and table["layout"].isna()[1]


def test_a_frozen_run_of_the_first_format_reads_with_every_column():
    from pathlib import Path

    from swabench.store import schema
    table, meta = derived.load(Path(__file__).parent / "fixtures" / "h200-run")
    assert set(schema.COLUMNS) <= set(table.columns) and meta["format_version"] == schema.FORMAT_VERSION
    assert meta["jit_warmups"] and table["upstream"].isna().all()  # before format 5: no upstream bug declared
    assert meta["libraries"] == {"flashinfer": "0.7.2.post1"} and "flashinfer" not in meta  # format 3 named it alone
    # format 2 kept how the wrapper was built in "wrapper" (now "layout"); every earlier run built its wrappers
    # in CUDA-graph mode; the serving axes take the values every case had
    assert table["layout"].dropna().str.startswith("cuda-graph").all() and (table["wrapper_mode"] == "cuda-graph").all()
    assert set(table["wrapper"]) <= {"prefill", "torch", "flex"}
    assert (table["kv_dtype"] == table["dtype"]).all() and not table["sinks"].any()
    assert (table["sm_scale"] == table["head_dim"] ** -0.5).all() and (table["logits_soft_cap"] == 0).all()
