"""Where the commands write: only over a regular file (never a device, a FIFO, a link or a folder), only
into a folder, never inside a run folder or what the command reads, never over another matrix unless
asked, and every refusal exit 2 with a message that says what the path is, before any work."""

import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import TINY, invoke

from swabench.run import hostbench, lifecycle, profiling
from swabench.store import paths, places, run_folder
from swabench.store.run_folder import RunFolderError, RunStore

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DUMP = FIXTURES / "flashinfer-dump-0.7.4" / "dump"
LONG = "x" * 256


@pytest.fixture
def odd(tmp_path):
    """Paths that exist and are no regular file: a FIFO, a link to a file, a folder."""
    (tmp_path / "target.md").write_text("kept\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link.md").symlink_to(tmp_path / "target.md")
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.fixture
def published(tmp_path):
    """A committed run folder: meta.json and tables, no rows.jsonl journal."""
    return shutil.copytree(FIXTURES / "h200-run", tmp_path / "published")


def scenario(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def unchanged(odd):
    assert stat.S_ISFIFO(os.lstat(odd / "fifo").st_mode) and (odd / "link.md").is_symlink()
    assert (odd / "target.md").read_text() == "kept\n"


# 1. a file is written by rename, so only where nothing is or over a regular file
@pytest.mark.parametrize("name,words", [("fifo", "is a FIFO, not a regular file"),
                                        ("link.md", "is a symbolic link (to "),
                                        ("folder", "is a folder, not a regular file")])
def test_a_file_out_that_is_no_regular_file_is_refused(odd, published, name, words):
    out = odd / name
    for args in (["import", DUMP, "--out", out, "--force"], ["findings", published, "--out", out]):
        r = invoke(*args)
        if name == "folder":  # click says it first for a file option
            assert r.exit_code == 2 and "is a directory" in r.output, r.output
            continue
        assert r.exit_code == 2 and words in r.output, (args, r.output)
    unchanged(odd)


def test_a_device_is_neither_a_file_nor_a_folder_to_write():
    """Checked, never written: a test that wrote to /dev/null would break the machine where it failed."""
    with pytest.raises(paths.OutputError, match="is a character device, not a regular file"):
        paths.file_out("/dev/null")
    with pytest.raises(paths.OutputError, match="is a character device, not a folder"):
        paths.folder_out("/dev/null")


def test_atomic_write_never_replaces_a_link_or_writes_into_a_fifo(odd):
    for name in ("link.md", "fifo", "folder"):
        with pytest.raises(paths.OutputError, match="the output"):
            run_folder.atomic_write(odd / name, "x")
    unchanged(odd)
    run_folder.atomic_write(odd / "target.md", "new\n")  # a regular file: replaced
    assert (odd / "target.md").read_text() == "new\n" and (odd / "link.md").read_text() == "new\n"


@pytest.mark.parametrize("name,words", [("fifo", "is a FIFO, not a folder"),
                                        ("dangling", "is a broken symbolic link")])
def test_a_folder_out_that_is_no_folder_is_refused(odd, published, name, words):
    (odd / "dangling").symlink_to(odd / "nowhere")
    out = odd / name
    for args in (["run", scenario(odd), "--device", "cpu", "--out", out], ["report", published, "--out", out],
                 ["merge", out, published]):
        r = invoke(*args)
        assert r.exit_code == 2 and words in r.output, (args, r.output)
    unchanged(odd)
    assert not (odd / "nowhere").exists()


# 15. a file's path that names a folder, or stdout
def test_a_trailing_slash_or_a_dash_is_refused(tmp_path, published, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in (["import", DUMP, "--force"], ["findings", published]):
        r = invoke(*command, "--out", "missing/")
        assert r.exit_code == 2 and "ends with /, so names a folder" in r.output, r.output
        r = invoke(*command, "--out", "-")
        assert r.exit_code == 2 and "writing to stdout is not supported" in r.output, r.output
    r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", "-")
    assert r.exit_code == 2 and "writing to stdout is not supported" in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["published", "tiny.toml"]


# 7b. a name longer than a file system takes
def test_a_name_over_255_bytes_exits_2(tmp_path, published, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["import", DUMP, "--out", LONG], ["findings", published, "--out", LONG],
                 ["report", published, "--out", LONG],
                 ["run", scenario(tmp_path), "--device", "cpu", "--out", Path(LONG) / "run"],
                 ["run", scenario(tmp_path), "--device", "cpu", "--out", LONG, "--resume"]):
        r = invoke(*args)
        assert r.exit_code == 2 and "is 256 bytes long; a name in a path may be at most 255 bytes" in r.output, \
            (args, r.output)
    assert "a name in a path may be at most" in invoke("import", DUMP, "--out", "é" * 128).output  # bytes, not letters


# 3. never over what the command reads
def test_an_output_inside_what_the_command_reads_is_refused(tmp_path):
    dump = shutil.copytree(DUMP, tmp_path / "dump")
    read = [dump / "session.jsonl", next(dump.glob("*/metadata.jsonl"))]
    before = [path.read_bytes() for path in read]
    for out in (*read, dump / "new.jsonl"):
        r = invoke("import", dump, "--out", out, "--force")
        assert r.exit_code == 2 and "which this command reads" in r.output, r.output
    assert [path.read_bytes() for path in read] == before and not (dump / "new.jsonl").exists()
    beside = tmp_path / "dump2" / "t.jsonl"  # a name that only starts like the input's
    assert invoke("import", dump, "--out", beside).exit_code == 0 and beside.read_text()


def test_refuse_inside_names_what_is_read(tmp_path):
    paths.refuse_inside(tmp_path / "a-b", [tmp_path / "a"])
    for out in (tmp_path / "a", tmp_path / "a" / "b" / "c"):
        with pytest.raises(paths.OutputError, match="inside .*, which this command reads"):
            paths.refuse_inside(out, [tmp_path / "z", tmp_path / "a"])


# 12. what --out and --resume say about a folder
def test_a_folder_that_is_no_run_is_called_so_and_resume_is_not_offered(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "notes")
    assert r.exit_code == 2 and "is not a run folder and is not empty: pick an empty or new folder" in r.output
    assert "--resume" not in r.output and "already holds a run" not in r.output
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["a.txt"]


def test_a_published_run_says_it_has_no_journal(published):
    with pytest.raises(RunFolderError, match="has its meta.json but no rows.jsonl") as refused:
        RunStore.resume(published, (published / "scenario.toml").read_text())
    assert "no meta.json" not in str(refused.value)
    with pytest.raises(RunFolderError, match="already holds a run; it has no rows.jsonl journal") as refused:
        RunStore.create(published, {}, "s")
    assert "pass --resume" not in str(refused.value)


def test_resume_is_offered_where_the_journal_is(tmp_path):
    RunStore.create(tmp_path / "run", {"gpu": "cpu"}, "s").close()
    with pytest.raises(RunFolderError, match="already holds a run; pass --resume to continue it"):
        RunStore.create(tmp_path / "run", {}, "s")


def test_default_folders_started_in_the_same_second_differ(tmp_path):
    made = [lifecycle.default_out("tiny", "cpu", "run", tmp_path) for _ in range(3)]
    assert len(set(made)) == 3 and all(folder.is_dir() for folder in made)
    assert places.new_folder(tmp_path, "x") != places.new_folder(tmp_path, "x")


@pytest.mark.slow
def test_a_default_folder_the_command_wrote_nothing_in_is_gone_at_exit(tmp_path):
    """A command refused after its default folder was made (the CPU price estimate here) leaves nothing
    behind; a folder something was written in is kept."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "swabench", "price", "--model", "gemma-3-27b"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "price on the CPU" in done.stderr, done.stderr
    assert not [p for p in (tmp_path / "runs").iterdir()], "an empty default folder was left behind"
    kept, empty = tmp_path / "kept", tmp_path / "empty"
    for folder in (kept, empty):
        folder.mkdir()
        (folder / run_folder.LOCK).write_text("")
    (kept / "meta.json").write_text("{}")
    for folder in (kept, empty, tmp_path / "never-made"):
        places.remove_if_empty(folder)
    assert kept.is_dir() and (kept / run_folder.LOCK).exists() and not empty.exists()


# 13. a run folder never inside another one
def test_no_run_is_made_inside_a_run_folder(tmp_path, published):
    path, trace = scenario(tmp_path), Path(__file__).resolve().parent.parent / "traces" / "example.jsonl"
    for args in (["run", path], ["check", path], ["replay", trace]):
        r = invoke(*args, "--device", "cpu", "--out", published / "sub")
        assert r.exit_code == 2 and "inside the run folder" in r.output, (args, r.output)
    for call in (lambda: hostbench.bench(published / "sub"), lambda: RunStore.create(published / "sub", {}, "s"),
                 lambda: profiling.run_under_ncu("s.toml", published / "sub", [], "cold"),
                 lambda: profiling.run_under_nsys("s.toml", published / "sub", [])):
        with pytest.raises(RunFolderError, match="inside the run folder"):
            call()
    assert not (published / "sub").exists() and not (published / "sub.ncu").exists()


# 2. a matrix over another one only when asked
@pytest.mark.slow
def test_a_matrix_of_other_runs_needs_force(tmp_path, monkeypatch):
    from test_matrix import three_releases

    monkeypatch.chdir(tmp_path)
    runs = three_releases(tmp_path)
    assert invoke("matrix", *runs).exit_code == 0
    written = {p.name: p.read_bytes() for p in (tmp_path / "runs" / "plots" / "matrix-release").iterdir()}
    assert invoke("matrix", *reversed(runs)).exit_code == 0  # the same runs again: fine
    r = invoke("matrix", *runs[:2])
    assert r.exit_code == 2 and "holds the matrix of other run folders" in r.output and "--force" in r.output
    assert {p.name: p.read_bytes() for p in (tmp_path / "runs" / "plots" / "matrix-release").iterdir()} == written
    assert invoke("matrix", *runs[:2], "--force").exit_code == 0
    assert "0.7.2.post1" not in (tmp_path / "runs" / "plots" / "matrix-release" / "MATRIX.md").read_text().splitlines()[0]


@pytest.mark.slow
def test_a_committed_matrix_names_its_runs_in_its_table(tmp_path, monkeypatch):
    """A published matrix has no made-from record (it is not committed): its Releases table says what it was made
    from, and its files, which nothing proves swabench wrote as they are, are replaced with --force."""
    from test_matrix import three_releases

    monkeypatch.chdir(tmp_path)
    runs = three_releases(tmp_path)
    assert invoke("matrix", *runs, "--out", "m").exit_code == 0
    (tmp_path / "m" / ".swabench-made-from").unlink()
    r = invoke("matrix", *runs[1:], "--out", "m")
    assert r.exit_code == 2 and str(runs[0]) in r.output
    r = invoke("matrix", *runs, "--out", "m")
    assert r.exit_code == 2 and "MATRIX.md exists and swabench did not write it" in r.output
    assert invoke("matrix", *runs, "--out", "m", "--force").exit_code == 0
    assert invoke("matrix", *runs, "--out", "m").exit_code == 0


def test_a_files_folder_is_checked_first_and_made_only_by_the_write(tmp_path):
    """`findings --out a/b/F.md` and `import --out` check the folder before any work and make it only when
    they write, so a command that fails between leaves no folder behind."""
    from swabench.publish import outputs

    target = outputs.file_path(tmp_path / "new" / "deeper" / "FINDINGS.md")
    assert not (tmp_path / "new").exists()
    run_folder.atomic_write(target, "page\n")
    assert target.read_text() == "page\n"
    (tmp_path / "plain").write_text("")
    with pytest.raises(paths.OutputError, match="plain is a regular file, not a folder"):
        outputs.file_path(tmp_path / "plain" / "sub" / "F.md")
    (tmp_path / "no-run").mkdir()
    failed = invoke("findings", str(tmp_path / "no-run"), "--out", str(tmp_path / "made" / "F.md"))
    assert failed.exit_code == 2 and "no-run" in failed.output and not (tmp_path / "made").exists()
