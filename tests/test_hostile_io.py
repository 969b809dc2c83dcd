"""The command line where the system itself is hostile: standard streams that cannot be written, a working folder
that is gone, names no file system holds, a disk or a file-size limit that runs out mid-run, and files that hold
what swabench never wrote.  Each ends in a plain message and a chosen exit status, never a traceback, and nothing
already recorded is lost."""

import errno
import json
import os
import resource
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from conftest import invoke

from swabench.publish import outputs
from swabench.store import paths, reading, run_folder

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "h200-run"
TINY = textwrap.dedent("""
    name = "tiny"
    implementations = ["torch-trim", "torch-mask"]
    [fixed]
    num_qo_heads = 4
    num_kv_heads = 2
    head_dim = 64
    batch_size = 2
    [[sweep]]
    mode = "verify"
    draft_tokens = 4
    prefix_len = [40, 60]
    window_left = [3, 15]
    """)


def swabench(*args, stdout, stderr=subprocess.PIPE, closed=(), **kw):
    """``python -m swabench ARGS`` with the standard streams given, and the descriptors in ``closed`` closed."""
    return subprocess.run([sys.executable, "-m", "swabench", *map(str, args)], stdout=stdout, stderr=stderr,
                          preexec_fn=(lambda: [os.close(fd) for fd in closed]) if closed else None, env=ENV, **kw)


def unwritable(kind):
    """A stdout that takes no write: closed, full, or open for reading only."""
    return {"closed": (subprocess.DEVNULL, (1,)), "full": (open("/dev/full", "w"), ()),
            "read-only": (open(os.devnull), ())}[kind]


# 1. a standard stream that cannot be written ends its output, never the command, and the exit status says so
@pytest.mark.parametrize("kind", ["closed", "full", "read-only"])
def test_help_to_an_unwritable_stdout_exits_1_without_a_traceback(kind):
    stdout, closed = unwritable(kind)
    done = swabench("--help", stdout=stdout, closed=closed, text=True)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("swabench: could not write to stdout (") and "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr  # the interpreter's last flush found somewhere to write


def test_with_stderr_unwritable_too_the_status_still_says_so():
    done = swabench("--help", stdout=open("/dev/full", "w"), stderr=open("/dev/full", "w"))
    assert done.returncode == 1
    done = swabench("show", "no-such-scenario", stdout=subprocess.PIPE, stderr=open("/dev/full", "w"))
    assert done.returncode == 2 and done.stdout == b""  # its own status kept: bad input


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["closed", "full", "read-only"])
def test_a_run_whose_stdout_is_unwritable_finishes_its_folder_and_exits_1(tmp_path, kind):
    (tmp_path / "tiny.toml").write_text(TINY)
    stdout, closed = unwritable(kind)
    done = swabench("run", tmp_path / "tiny.toml", "--device", "cpu", "--out", tmp_path / "run", stdout=stdout,
                    closed=closed, text=True)
    assert done.returncode == 1 and "could not write to stdout" in done.stderr and "Traceback" not in done.stderr
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["state"] == "complete"
    rows = (tmp_path / "run" / "rows.jsonl").read_text().splitlines()
    assert len(pd.read_csv(tmp_path / "run" / "results.csv")) == len(rows) == 8  # no output landed in a file
    assert all(row.startswith("{") for row in rows)


# 2. a working folder that was deleted
def test_a_deleted_working_folder_is_refused_before_anything_starts(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for args in (["list"], ["show", "quick"], ["run", "--device", "cpu"]):
        r = invoke(*args)
        assert r.exit_code == 2 and "the working folder no longer exists" in r.output, r.output


# 3. a name no file system holds, as typed or as swabench makes it from what was typed
@pytest.mark.parametrize("args, named", [
    (["show", "a" * 300], "SCENARIO: the name"),
    (["report", "a" * 300], "RUN_DIR: the name"),
    (["run", "a" * 300, "--device", "cpu"], "SCENARIO: the name"),
    (["show", "b" * 252], "... is 257 bytes long"),  # a scenario name, looked up as NAME.toml
])
def test_a_name_over_255_bytes_exits_2_naming_it(tmp_path, monkeypatch, args, named):
    monkeypatch.chdir(tmp_path)
    r = invoke(*args)
    assert r.exit_code == 2 and named in r.output and "a name in a path may be at most 255 bytes" in r.output, \
        r.output


# 4. a journal the system stops taking rows into (a file-size limit here; a full disk the same way)
def test_a_journal_write_the_system_refuses_leaves_the_journal_as_it_was(tmp_path):
    code = textwrap.dedent(f"""
        import resource, sys
        from pathlib import Path
        from swabench.store import run_folder
        journal = Path({str(tmp_path)!r}) / "rows.jsonl"
        journal.write_text('{{"a": 1}}\\n')
        store = run_folder.RunStore(journal.parent)
        resource.setrlimit(resource.RLIMIT_FSIZE, (journal.stat().st_size + 100, resource.RLIM_INFINITY))
        try:
            store.extend([{{"a": 2}}, {{"b": "x" * 1000}}])
        except run_folder.JournalError as e:
            print(e)
            sys.exit(3)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert done.returncode == 3, done.stderr
    assert f"{tmp_path}: cannot record a result in rows.jsonl (File too large)" in done.stdout
    assert "--resume" in done.stdout
    assert (tmp_path / "rows.jsonl").read_text() == '{"a": 1}\n'  # the part of a row written, cut off again


@pytest.mark.slow
def test_a_run_past_the_file_size_limit_ends_with_a_message_and_resumes(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "run"
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))  # noqa: E731
    done = subprocess.run([sys.executable, "-m", "swabench", "run", tmp_path / "tiny.toml", "--device", "cpu",
                           "--out", out], capture_output=True, text=True, env=ENV, preexec_fn=limit)
    assert done.returncode == 1 and f"{out}: cannot record a result in rows.jsonl (File too large)" in done.stderr
    assert "Traceback" not in done.stderr
    kept = (out / "rows.jsonl").read_text()
    assert kept.endswith("\n") and 1 <= len(kept.splitlines()) < 8
    assert json.loads((out / "meta.json").read_text())["state"] == "crashed"
    r = invoke("run", tmp_path / "tiny.toml", "--device", "cpu", "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert (out / "rows.jsonl").read_text().startswith(kept) and len(pd.read_csv(out / "results.csv")) == 8


def test_a_disk_that_fills_mid_run_reports_the_journal_not_the_table_it_then_cannot_write(tmp_path, monkeypatch):
    """From the third row on nothing can be written (a full disk): the run ends on the journal's message, exit 1,
    its two rows kept, though the table of the crashed run could not be written either."""
    (tmp_path / "tiny.toml").write_text(TINY)
    out, extend = tmp_path / "run", run_folder.RunStore.extend

    def fill(self, rows):
        if len(self.rows()) == 2:
            def no_room(path, data):
                raise paths.OutputError(f"cannot write {path}: {os.strerror(errno.ENOSPC)}")
            monkeypatch.setattr(run_folder, "atomic_write", no_room)
            raise run_folder.JournalError(self.folder, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        extend(self, rows)

    monkeypatch.setattr(run_folder.RunStore, "extend", fill)
    r = invoke("run", tmp_path / "tiny.toml", "--device", "cpu", "--out", out)
    assert r.exit_code == 1 and f"{out}: cannot record a result in rows.jsonl (No space left on device)" in r.output, \
        r.output
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2


# 5. files that hold what swabench never wrote there
def test_a_small_file_is_read_without_taking_memory_for_the_limit(tmp_path):
    small = tmp_path / "rows.jsonl"
    small.write_bytes(b"x" * 5000)
    tracemalloc.start()
    try:
        assert reading.read_bytes(small, reading.TABLE) == b"x" * 5000  # a limit of 4 GiB
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_a_file_that_grows_past_the_limit_while_read_is_refused(tmp_path, monkeypatch):
    grown = tmp_path / "grown"
    grown.write_bytes(b"x" * 10)
    real = os.fstat
    monkeypatch.setattr(reading.os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 4, *real(fd)[7:])))
    assert reading.read_bytes(grown, 10) == b"x" * 10  # its size said 4: read on to the end
    with pytest.raises(reading.ReadError, match="larger than 9 bytes"):
        reading.read_bytes(grown, 9)


@pytest.mark.parametrize("make", [outputs.figures_folder, outputs.matrix_folder])
def test_a_binary_made_from_record_is_another_runs_unless_forced(tmp_path, make):
    out = tmp_path / "plots"
    out.mkdir()
    (out / outputs.MADE_FROM).write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    args = (FIXTURE_RUN, out, ["REPORT.md"]) if make is outputs.figures_folder else (out, "s", [FIXTURE_RUN])
    with pytest.raises(outputs.OutputError, match=r"unknown run folders .*not UTF-8 text.*--force"):
        make(*args)
    make(*args, force=True)
    assert outputs.made_from(out) == str(FIXTURE_RUN.resolve())
