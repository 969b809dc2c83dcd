"""scripts/restatus.py on folders it must refuse: every folder is checked before any is recomputed or written, a
wrong one is a message naming it and exit 2 (never a traceback, never exit 0), and --write never writes through a
link nor leaves a table and a meta.json that disagree."""

import gzip
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "h200-run"
spec = importlib.util.spec_from_file_location("restatus", ROOT / "scripts" / "restatus.py")
restatus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(restatus)
WRITE = ["--write", "--why", "the fa2 tile rule"]


def refused(capsys, *argv) -> str:
    """What restatus says refusing ``argv``: it must exit 2."""
    with pytest.raises(SystemExit) as exit_:
        restatus.main([str(a) for a in argv])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture
def run(tmp_path) -> Path:
    return shutil.copytree(FIXTURE, tmp_path / "run")


def test_a_path_that_is_no_run_folder_is_exit_2(tmp_path, capsys):
    assert str(tmp_path / "nope") in refused(capsys, tmp_path / "nope")
    (tmp_path / "file").write_text("")
    assert "not a folder" in refused(capsys, tmp_path / "file")


def junk(run: Path, kind: str) -> str:
    """Spoil one of ``run``'s files; the name the refusal must give."""
    if kind == "no meta":
        (run / "meta.json").unlink()
        return "meta.json"
    if kind == "meta not JSON":
        (run / "meta.json").write_text("{not json")
        return "meta.json"
    if kind == "meta field":
        (run / "meta.json").write_text('{"gpu_sms": "many"}')
        return "gpu_sms"
    if kind == "scenario":
        (run / "scenario.toml").write_text("name = [")
        return "scenario.toml"
    if kind == "no scenario":
        (run / "scenario.toml").unlink()
        return "scenario.toml"
    if kind == "table cell":
        text = (run / "results.csv").read_text().replace(",xpass,", ",maybe,", 1)
        (run / "results.csv").write_text(text)
        return "results.csv"
    if kind == "table columns":
        (run / "results.csv").write_text("a,b\n1,2\n")
        return "must_fail"
    if kind == "corrupt gz":
        (run / "results.csv").unlink()
        (run / "results.csv.gz").write_bytes(gzip.compress(b"case_id,impl\n")[:20])
        return "results.csv.gz"
    if kind == "journal":
        (run / "rows.jsonl").write_text("")
        return "rows.jsonl"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["no meta", "meta not JSON", "meta field", "scenario", "no scenario", "table cell",
                                  "table columns", "corrupt gz", "journal"])
def test_a_folder_whose_files_do_not_read_as_a_run_is_refused_before_any_is_written(tmp_path, capsys, kind):
    """The good folder given first is not written either: every folder is checked before any is recomputed."""
    good = shutil.copytree(FIXTURE, tmp_path / "good")
    bad = shutil.copytree(FIXTURE, tmp_path / "bad")
    named = junk(bad, kind)
    before = files_of(good)
    said = refused(capsys, good, bad, *WRITE)
    assert named in said and "Traceback" not in said
    assert files_of(good) == before


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_write_never_writes_through_a_link(tmp_path, capsys, run, link):
    elsewhere = tmp_path / "elsewhere.csv"
    shutil.move(run / "results.csv", elsewhere)
    (os.symlink if link == "symbolic" else os.link)(elsewhere, run / "results.csv")
    before = elsewhere.read_bytes(), (run / "meta.json").read_bytes()
    assert "results.csv" in refused(capsys, run, *WRITE)
    assert (elsewhere.read_bytes(), (run / "meta.json").read_bytes()) == before


def test_write_leaves_the_table_where_meta_json_cannot_be_written(tmp_path, capsys, run):
    """An immutable meta.json (chattr +i) is found before the table is written, not after."""
    if subprocess.run(["chattr", "+i", run / "meta.json"], capture_output=True).returncode:
        pytest.skip("chattr +i is not allowed here")
    try:
        before = files_of(run)
        assert "meta.json" in refused(capsys, run, *WRITE)
        assert files_of(run) == before
    finally:
        subprocess.run(["chattr", "-i", run / "meta.json"], check=True)


def test_a_folder_given_twice_is_refused(capsys, run):
    assert "same run folder" in refused(capsys, run, run, *WRITE)


def test_write_replaces_the_table_by_a_rename(run):
    """The table written back is a new file (its inode differs): a reader never sees it half written."""
    inode = (run / "results.csv").stat().st_ino
    assert restatus.main([str(run), *WRITE]) == 0
    assert (run / "results.csv").stat().st_ino != inode
    assert ",pass,case does not exercise the bug" in (run / "results.csv").read_text()


def test_a_correct_paths_failed_rows_read_against_a_precondition_declared_since(tmp_path):
    """The FA3 stale run's four ragged fails (before fa3-varlen-total-k was declared) become xfail naming it; its
    paged points and the rows no declaration covers stay as they are."""
    import json

    import pandas as pd

    run = shutil.copytree(ROOT / "tests" / "fixtures" / "h100-stale-fa3", tmp_path / "run")
    before = pd.read_csv(run / "results.csv.gz", dtype=str, keep_default_na=False)
    assert restatus.main([str(run), "--write", "--why", "fa3-varlen-total-k declared"]) == 0
    after = pd.read_csv(run / "results.csv.gz", dtype=str, keep_default_na=False)
    moved = before["status"] != after["status"]
    assert moved.sum() == 4 and set(before[moved]["status"]) == {"fail"} and set(after[moved]["status"]) == {"xfail"}
    assert set(after[moved]["upstream"]) == {"fa3-varlen-total-k"} and set(after[moved]["storage"]) == {"ragged"}
    assert after[moved]["reason"].str.startswith("documented precondition fa3-varlen-total-k: ").all()
    assert before[~moved].equals(after[~moved])
    meta = json.loads((run / "meta.json").read_text())
    assert meta["statuses_recomputed"][-1]["changes"] == {"fail -> xfail (fa3-varlen-total-k)": 4}
    assert "fail" not in meta["status_counts"]
