import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from swabench.analysis import derived
from swabench.store import run_folder
from swabench.store.run_folder import RunFolderError, RunStore


def row(i, **kw):
    return {"case_id": f"c{i}", "impl": "torch-trim", "backend": "torch", "status": "pass",
            "median_us": float(i), "samples": {"kernel": [1.0, 2.0, float(i)]}, **kw}


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


def test_a_frozen_run_of_the_first_format_reads_with_every_column():
    from pathlib import Path

    from swabench.store import schema
    table, meta = derived.load(Path(__file__).parent / "fixtures" / "h200-run")
    assert set(schema.COLUMNS) <= set(table.columns) and meta["format_version"] == schema.FORMAT_VERSION
    assert meta["jit_warmups"] and table["upstream"].isna().all()  # before format 5: no upstream bug declared
    assert meta["libraries"] == {"flashinfer": "0.7.2.post1"} and "flashinfer" not in meta  # format 3 named it alone
    # format 2 kept how the wrapper was built in "wrapper"; the serving axes take the values every case had
    assert table["wrapper_mode"].dropna().str.startswith("cuda-graph").all()
    assert set(table["wrapper"]) <= {"prefill", "torch", "flex"}
    assert (table["kv_dtype"] == table["dtype"]).all() and not table["sinks"].any()
    assert (table["sm_scale"] == table["head_dim"] ** -0.5).all() and (table["logits_soft_cap"] == 0).all()
