"""Where a hostile layout would make a writer destroy a user's files, the user's files survive: a path through a
folder that does not exist and then ``..`` is refused (exit 2) before any work, since the system opens no
``nope/..``; a ``..`` after a folder that exists writes where the system points; a lock file that is not
swabench's is never truncated."""

import shutil
from pathlib import Path

import pytest
from conftest import TINY, invoke
from test_matrix import three_releases
from test_refusals import DECODE, _tree, exported, trace

from swabench.publish import plots
from swabench.store import run_folder

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_RUN = FIXTURES / "h200-run"
DUMP = FIXTURES / "flashinfer-dump-0.7.4" / "dump"
MINE = b"# swabench report: my own notes, not swabench's\n"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\x10tEXtSoftware\x00swabench" + b"my own figure"


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """The working folder a hostile user sets up: their own files where the writers write, and what the
    writers read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "mine.txt").write_text("mine\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "REPORT.md").write_bytes(MINE)
    (tmp_path / "o" / plots.figure_files()[0]).write_bytes(PNG)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "MATRIX.md").write_text("# my matrix\n")
    for name in ("F.md", "t.jsonl", "s.py", "s.md"):
        (tmp_path / name).write_text(f"my {name}\n")
    shutil.copytree(FIXTURE_RUN, tmp_path / "RUN")
    (tmp_path / "tiny.toml").write_text(TINY)
    trace(tmp_path / "steps.jsonl")
    exported(tmp_path)  # fib/ from t.jsonl, which trace() wrote: write the user's back
    (tmp_path / "t.jsonl").write_text("my t.jsonl\n")
    three_releases(tmp_path / "runs")
    return tmp_path


WRITERS = {
    "export-fib into the working folder": ["export-fib", "steps.jsonl", "--out", "nope/..", "--force"],
    "export-fib over a folder": ["export-fib", "steps.jsonl", "--out", "{tmp}/nope/../victim", "--force"],
    "report": ["report", "RUN", "--out", "nope/../o"],
    "plot": ["plot", "RUN", "--out", "nope/../o"],
    "findings": ["findings", "RUN", "--out", "nope/../F.md"],
    "import": ["import", DUMP, "--out", "nope/../t.jsonl"],
    "import-fib": ["import-fib", "fib", "--definition", DECODE, "--model", "gemma-3-4b", "--out", "nope/../t.jsonl"],
    "repro": ["repro", "--bug", "paged-plan-no-window", "--out", "nope/../s.py", "--issue"],
    "bench-host": ["bench-host", "--quick", "--out", "nope/../RUN"],
    "run": ["run", "tiny.toml", "--device", "cpu", "--out", "nope/../RUN"],
    "matrix": ["matrix", "runs/new", "runs/old", "runs/mid", "--out", "nope/../m"],
}


@pytest.mark.parametrize("args", WRITERS.values(), ids=WRITERS.keys())
def test_an_out_through_a_missing_folder_and_dotdot_is_refused_and_nothing_is_touched(layout, args):
    before = _tree(layout)
    r = invoke(*[str(a).format(tmp=layout) for a in args])
    assert r.exit_code == 2 and "nope is not a folder that exists" in r.output and "--out" in r.output, r.output
    assert _tree(layout) == before


def test_a_dotdot_after_a_folder_that_exists_writes_where_the_system_points(tmp_path, monkeypatch, one_figure):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert invoke("report", FIXTURE_RUN, "--out", "sub/../rep").exit_code == 0
    assert invoke("findings", FIXTURE_RUN, "--out", "sub/../F.md").exit_code == 0
    assert (tmp_path / "rep" / "REPORT.md").is_file() and (tmp_path / "F.md").is_file()
    assert list((tmp_path / "sub").iterdir()) == []


def test_a_lock_file_that_is_not_swabenchs_is_never_truncated(tmp_path, write_scenario):
    scenario, out = write_scenario(TINY), tmp_path / "out"
    out.mkdir()
    (out / run_folder.LOCK).write_text("my notes\n")
    r = invoke("run", scenario, "--device", "cpu", "--impl", "torch-trim", "--out", out)
    assert r.exit_code == 2 and "is not swabench's lock" in r.output, r.output
    assert (out / run_folder.LOCK).read_text() == "my notes\n" and [p.name for p in out.iterdir()] == [run_folder.LOCK]
    (out / run_folder.LOCK).write_text("pid 999999999 on gone-host since 2020-01-01T00:00:00+00:00\n")
    r = invoke("run", scenario, "--device", "cpu", "--impl", "torch-trim", "--out", out)
    assert r.exit_code == 0 and "took over the lock" in r.output, r.output  # its own lock, left by a dead holder
