"""Bad input and damaged state, as a hostile user meets them: every one ends in a clear message and
exit status 2 (or a recorded skip), never a traceback, and nothing already recorded is lost."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from conftest import invoke

from swabench.core import footprint, workloads
from swabench.store import run_folder
from swabench.inputs import scenarios
from swabench.impls import registry

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
    prefix_len = 40
    window_left = [3, 15]
    """)


def scenario(tmp_path, text=TINY, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != run_folder.LOCK}


# 1. the scenario name becomes a folder name
@pytest.mark.parametrize("name", ["../../tmp/evil", "/tmp/evil", "..", ".hidden", "a b", "x" * 101])
def test_a_name_that_is_not_a_slug_is_refused(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path = scenario(tmp_path, TINY.replace('name = "tiny"', f"name = {json.dumps(name)}"))
    r = invoke("run", path, "--device", "cpu")
    assert r.exit_code == 2 and "name: must be letters, digits" in r.output
    assert not (tmp_path / "runs").exists() and not os.path.exists("/tmp/evil")


def test_the_default_folder_stays_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = scenario(tmp_path, TINY.replace('name = "tiny"', ""), "my scenario!.toml")  # no name: the stem
    r = invoke("run", path, "--device", "cpu", "--impl", "torch-trim")
    assert r.exit_code == 0, r.output
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("my-scenario--run-cpu-")


# 2. readers on runs in every state
@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    assert invoke("run", scenario(folder), "--device", "cpu", "--out", folder / "run").exit_code == 0
    return folder / "run"


@pytest.fixture
def runs_in_every_state(tmp_path, monkeypatch):
    folders = {}
    with monkeypatch.context() as starved:  # every case too big: each point a skip, the folder kept as skipped
        starved.setattr(workloads, "free_bytes", lambda device: 1 << 10)
        assert invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "all-skip").exit_code == 2
    folders["all-skip"] = tmp_path / "all-skip"
    xfail = scenario(tmp_path, TINY.replace('["torch-trim", "torch-mask"]', '["planted-wide"]'), "xfail.toml")
    assert invoke("run", xfail, "--device", "cpu", "--out", tmp_path / "all-xfail").exit_code == 0
    folders["all-xfail"] = tmp_path / "all-xfail"
    store = run_folder.RunStore.create(tmp_path / "zero", {"scenario": "zero", "state": "running"}, "x")
    store.finalize(state="complete")
    store.close()
    folders["zero-rows"] = tmp_path / "zero"
    assert invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "cut").exit_code == 0
    for name in (run_folder.TABLE, run_folder.SAMPLES):
        (tmp_path / "cut" / name).unlink()
    meta = json.loads((tmp_path / "cut" / run_folder.META).read_text())
    (tmp_path / "cut" / run_folder.META).write_text(json.dumps({**meta, "state": "interrupted"}))
    folders["interrupted"] = tmp_path / "cut"
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("command", ["summary", "plot", "report"])
def test_readers_handle_runs_with_nothing_to_time(runs_in_every_state, tmp_path, command, one_figure):
    for state, folder in runs_in_every_state.items():
        extra = ["--out", tmp_path / f"{command}-{state}"] if command != "summary" else []
        r = invoke(command, folder, *extra)
        assert r.exit_code == 0, (state, r.output)
        if state == "interrupted":
            assert "this run is interrupted: 4 of 4 points recorded" in r.output


@pytest.mark.parametrize("damage,words", [
    ({"meta.json": "{not json"}, "not valid JSON"),
    ({"meta.json": "[1, 2]"}, "does not hold a JSON object"),
    ({"rows.jsonl": None, "results.csv": "\x00\x01garbage\n,,\n"}, "results.csv"),
    ({"rows.jsonl": None, "results.csv": "a,b\n1,2\n"}, "no column case_id"),
    ({"rows.jsonl": '{"case_id": "x", "impl": "y", "backend": "z"}\n[1, 2]\n{"case_id": "y"}\n'}, "line 2"),
])
@pytest.mark.parametrize("command", ["summary", "plot", "report", "compare"])
def test_damaged_run_folders_exit_2(tmp_path, good_run, damage, words, command):
    out, good = tmp_path / "run", good_run
    shutil.copytree(good_run, out)
    for name, text in damage.items():
        (out / name).unlink() if text is None else (out / name).write_text(text)
    args = [good, out] if command == "compare" else [out] + (["--out", tmp_path / "figs"] if command != "summary" else [])
    r = invoke(command, *args)
    assert r.exit_code == 2 and words in r.output, r.output


# 3. memory: impossible cases refused before anything is written, big ones skipped
@pytest.mark.parametrize("edit,words", [
    (("batch_size = 2", "batch_size = 1000000000"), "batch_size"),
    (("prefix_len = 40", "prefix_len = 1000000000000"), "prefix_len"),
])
def test_impossible_sizes_exit_2_before_anything_is_written(tmp_path, edit, words):
    started = time.perf_counter()
    r = invoke("run", scenario(tmp_path, TINY.replace(*edit)), "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and words in r.output, r.output
    assert time.perf_counter() - started < 10 and not (tmp_path / "run").exists()


def test_a_case_too_big_for_this_device_is_a_skip_with_its_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(workloads, "free_bytes", lambda device: 1 << 10)  # 1 KiB free
    r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "nothing ran" in r.output, r.output
    table = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    assert (table["status"] == "skip").all() and table["reason"].str.contains("needs about").all()
    assert table["reason"].str.contains("free").all()


def test_show_prints_the_memory_estimate(tmp_path):
    r = invoke("show", scenario(tmp_path), "--cases")
    case = footprint.footprint(scenarios.load(scenario(tmp_path)).cases[0], "cuda")
    assert r.exit_code == 0 and "memory: the largest case needs" in r.output and case.describe() in r.output


# 4. skip rules evaluate under limits
@pytest.mark.parametrize("rule,words", [
    ("'a' * 4000000000 == 'b'", "skip[0].when"),
    ("prefix_len // 0 == 1", "skip[0].when"),
    ("(" * 5000 + "prefix_len > 1" + ")" * 5000, "skip[0].when"),
    (" * ".join(["prefix_len"] * 500) + " > 1", "skip[0].when"),
    ("prefix_len", "skip[0].when"),
])
def test_skip_rules_fail_fast_and_name_the_rule(tmp_path, rule, words):
    started = time.perf_counter()
    r = invoke("show", scenario(tmp_path, TINY + f"[[skip]]\nwhen = {json.dumps(rule)}\nreason = 'r'\n"))
    assert r.exit_code == 2 and words in r.output, r.output
    assert time.perf_counter() - started < 5


# 6. an --out that cannot be written
def test_an_unwritable_out_exits_2(tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file" / "run", "/proc/swabench-run"):
        r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", out)
        assert r.exit_code == 2 and "cannot write to" in r.output, r.output
        r = invoke("plot", tmp_path, "--out", out)
        assert r.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_exits_2(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "ro" / "run")
    assert r.exit_code == 2 and "Permission denied" in r.output


# 7. one process writes a run folder at a time
def test_a_second_process_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    path = scenario(tmp_path)
    assert invoke("run", path, "--device", "cpu", "--out", out, "--impl", "torch-trim").exit_code == 0
    before = snapshot(out)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from swabench.store.lock import FolderLock
        FolderLock({str(out)!r}).acquire()
        print("locked", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = invoke("run", path, "--device", "cpu", "--out", out, "--resume", "--impl", "torch-trim")
        assert r.exit_code == 2 and f"pid {holder.pid}" in r.output, r.output
        assert snapshot(out) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    r = invoke("run", path, "--device", "cpu", "--out", out, "--resume", "--impl", "torch-trim")
    assert r.exit_code == 0 and "took over the lock" in r.output and f"pid {holder.pid}" in r.output, r.output
    assert len(pd.read_csv(out / run_folder.TABLE)) == 2


@pytest.mark.parametrize("change", [["--impl", "torch-mask"], ["--case", "W3"], ["--shard", "0/2"], ["--l2", "warm"]])
def test_resume_refuses_other_points_or_options(tmp_path, change):
    out, path = tmp_path / "run", scenario(tmp_path)
    assert invoke("run", path, "--device", "cpu", "--out", out, "--impl", "torch-trim").exit_code == 0
    before = snapshot(out)
    r = invoke("run", path, "--device", "cpu", "--out", out, "--impl", "torch-trim", "--resume", *change)
    assert r.exit_code == 2 and "other points or options" in r.output and "--resume" in r.output, r.output
    assert snapshot(out) == before
    r = invoke("check", path, "--device", "cpu", "--out", out, "--impl", "torch-trim", "--resume")
    assert r.exit_code == 2 and "holds a run" in r.output


def test_ctrl_c_before_the_sweep_leaves_an_interrupted_folder(tmp_path, monkeypatch):
    from swabench.run import lifecycle as runs

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_folder.RunStore, "done", interrupted)
    r = invoke("run", scenario(tmp_path), "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 130 and "--resume" in r.output, r.output
    assert json.loads((tmp_path / "run" / run_folder.META).read_text())["state"] == "interrupted"
    here = tmp_path / "x"  # the folder as given now, whatever --out its recorded command names
    assert runs.rerun_command(here, "swabench run a.toml --out y") == f"swabench run a.toml --out {here} --resume"
    assert runs.rerun_command(here, "swabench run a.toml --out=y --resume").endswith(f"--resume --out {here}")


# 8. a merge that misses shards
def test_merge_refuses_missing_shards_unless_partial(tmp_path):
    path = scenario(tmp_path)
    assert invoke("run", path, "--device", "cpu", "--shard", "0/2", "--out", tmp_path / "s0").exit_code == 0
    r = invoke("merge", tmp_path / "m", tmp_path / "s0")
    assert r.exit_code == 2 and "shard(s) 1/2 missing" in r.output and not (tmp_path / "m").exists()
    r = invoke("merge", tmp_path / "m", tmp_path / "s0", "--partial")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m" / run_folder.META).read_text())["state"] == "incomplete"


# 9. a resource problem is a skip with the library's message, never a failure
def test_a_resource_error_is_a_skip(tmp_path, monkeypatch):
    trim = registry.get("torch-trim")

    class Starved:
        out = None
        resolved_backend = "torch"

        def plan(self):
            raise registry.ResourceError("Buffer overflow when allocating memory: increase the workspace")

    starved = registry.Implementation("torch-starved", "torch", trim.storages, "no workspace", lambda w, b: Starved())
    monkeypatch.setitem(registry._REGISTRY, "torch-starved", starved)
    path = scenario(tmp_path, TINY.replace('["torch-trim", "torch-mask"]', '["torch-starved"]'))
    r = invoke("run", path, "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "every one of 2 points skips here: resource: Buffer overflow" in r.output, r.output
    table = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    assert (table["status"] == "skip").all()
    assert table["reason"].str.startswith("resource: Buffer overflow").all()


@pytest.mark.slow
def test_the_sweep_loads_no_library_module():
    code = ("import sys, swabench.run.sweep, swabench.run.lifecycle, swabench.store.run_folder; "
            "bad = [m for m in sys.modules if 'flashinfer' in m or m.endswith(('.flex', '.embedded'))]; "
            "sys.exit(', '.join(bad) or None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# 10. outputs: never into a run folder, never a traceback, never over another run's report
def test_outputs_that_cannot_be_written_exit_2(tmp_path, good_run):
    (tmp_path / "file").write_text("x")
    meta = (good_run / run_folder.META).read_bytes()
    for out, words in [(tmp_path / "file" / "F.md", "cannot write to"), ("/proc/swabench/F.md", "cannot write to"),
                       (good_run / run_folder.META, "inside the run folder"),
                       (good_run / "pages" / "F.md", "inside the run folder")]:
        r = invoke("findings", good_run, "--out", out)
        assert r.exit_code == 2 and words in r.output, (out, r.output)
    assert (good_run / run_folder.META).read_bytes() == meta and not (good_run / "pages").exists()
    r = invoke("findings", good_run, "--out", tmp_path / "new" / "deeper" / "F.md")  # a missing folder is made
    assert r.exit_code == 0 and (tmp_path / "new" / "deeper" / "F.md").read_text().startswith("# Findings")
    for command in ("report", "plot"):
        r = invoke(command, good_run, "--out", good_run / "figs")
        assert r.exit_code == 2 and "inside the run folder" in r.output and not (good_run / "figs").exists()
    path = scenario(tmp_path)
    for out, words in [(tmp_path / "file" / "sub", "cannot write to"), (good_run / "sub", "inside the run folder")]:
        r = invoke("submit", path, "--shards", "2", "--executor", "local", "--out", out)
        assert r.exit_code == 2 and words in r.output, r.output
    r = invoke("merge", good_run / "merged", good_run)
    assert r.exit_code == 2 and "inside the run folder" in r.output and not (good_run / "merged").exists()


def test_findings_without_out_prints_the_page_and_writes_nothing(tmp_path, good_run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("findings", good_run)
    assert r.exit_code == 0 and r.output.startswith("# Findings")
    assert f"```\nswabench findings \\\n    {good_run}\n```" in r.output and list(tmp_path.iterdir()) == []
    assert "printed to stdout" in invoke("findings", "--help").output


@pytest.mark.slow
def test_a_report_of_another_run_with_the_same_name_needs_force(tmp_path, good_run, monkeypatch, one_figure):
    monkeypatch.chdir(tmp_path)
    twin = shutil.copytree(good_run, tmp_path / "elsewhere" / good_run.name)
    assert invoke("report", good_run).exit_code == 0
    report = tmp_path / "runs" / "plots" / good_run.name / "REPORT.md"
    first = report.read_text()
    assert invoke("report", good_run).exit_code == 0  # the same run again: fine
    r = invoke("report", twin)
    assert r.exit_code == 2 and "another run folder" in r.output and "--force" in r.output
    assert report.read_text() == first
    r = invoke("plot", twin)
    assert r.exit_code == 2 and "--force" in r.output
    r = invoke("report", twin, "--force")
    assert r.exit_code == 0 and str(twin) in report.read_text()


# 11. what a refused resume says
def test_resume_hints_name_the_folder_as_given_now(tmp_path):
    path = scenario(tmp_path)
    assert invoke("run", path, "--device", "cpu", "--out", tmp_path / "orig", "--impl", "torch-trim").exit_code == 0
    copy = shutil.copytree(tmp_path / "orig", tmp_path / "copy")
    r = invoke("run", path, "--device", "cpu", "--out", copy, "--impl", "torch-mask", "--resume")
    assert r.exit_code == 2 and f"--out {copy} --resume" in r.output and str(tmp_path / "orig") not in r.output
    assert "(None)" not in r.output


def test_a_merged_folder_says_it_cannot_be_resumed(tmp_path):
    path = scenario(tmp_path)
    for i in range(2):
        assert invoke("run", path, "--device", "cpu", "--shard", f"{i}/2", "--out", tmp_path / f"s{i}").exit_code == 0
    assert invoke("merge", tmp_path / "m", tmp_path / "s0", tmp_path / "s1").exit_code == 0
    r = invoke("run", path, "--device", "cpu", "--out", tmp_path / "m", "--resume")
    assert r.exit_code == 2 and "is a merge of 2 shards and cannot be resumed" in r.output, r.output
    assert str(tmp_path / "s1") in r.output and "merge them again" in r.output
    assert "(None)" not in r.output and "merge " + str(tmp_path / "m") not in r.output


def test_a_resume_refuses_a_journal_row_of_another_run(tmp_path):
    """A line copied from another run's journal is not one of this run's points: the resume says so and changes
    nothing, rather than count it as this run's (a 2-point run must not finish with 3 rows)."""
    path = scenario(tmp_path)
    for impl in ("torch-trim", "torch-mask"):
        assert invoke("run", path, "--device", "cpu", "--out", tmp_path / impl, "--impl", impl).exit_code == 0
    out = tmp_path / "torch-trim"
    foreign = (tmp_path / "torch-mask" / run_folder.ROWS).read_text().splitlines()[0]
    with open(out / run_folder.ROWS, "a") as journal:
        journal.write(foreign + "\n")
    before = snapshot(out)
    r = invoke("run", path, "--device", "cpu", "--out", out, "--impl", "torch-trim", "--resume")
    assert r.exit_code == 2, r.output
    assert f"{out / run_folder.ROWS}: 1 row(s) are not points of this run (2 points), e.g. line 3" in r.output
    assert "impl torch-mask" in r.output
    assert snapshot(out) == before


def test_a_replay_resumed_with_other_implementations_says_so(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"mode": "decode", "num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64,
                                 "sliding_window": 16, "page_size": 16, "requests": [[40, 1]]}) + "\n")
    assert invoke("replay", trace, "--impl", "torch-trim", "--device", "cpu", "--out", tmp_path / "run").exit_code == 0
    r = invoke("replay", trace, "--impl", "torch-mask", "--device", "cpu", "--out", tmp_path / "run", "--resume")
    assert r.exit_code == 2 and "ran the implementations ['torch-trim']" in r.output, r.output
    assert "asks for ['torch-mask']" in r.output and "different scenario file" not in r.output
    other = tmp_path / "u.jsonl"
    other.write_text(trace.read_text().replace("[[40, 1]]", "[[50, 1]]"))
    r = invoke("replay", other, "--impl", "torch-trim", "--device", "cpu", "--out", tmp_path / "run", "--resume")
    assert r.exit_code == 2 and "different scenario file" in r.output


# 12. a published folder edited by hand is checked on read
def set_cell(column, row, value):
    return lambda t: t.assign(**{column: t[column].astype(object).where(t.index != row, value)})


@pytest.mark.parametrize("edit,words", [
    (set_cell("median_us", 1, -5.0), "line 3, column median_us: -5.0 is not allowed (a finite number >= 0, or empty)"),
    (set_cell("median_us", 0, float("nan")), "line 2, column median_us: '' is not allowed (a number: the row was"),
    (set_cell("status", 2, "maybe"), "line 4, column status: 'maybe' is not allowed (one of pass, fail, xfail, xpass"),
    (lambda t: pd.concat([t, t.iloc[[0]]]), "line 6, column case_id, impl, backend:"),
    (set_cell("plan_us", 0, "fast"), "line 2, column plan_us: 'fast' is not allowed"),
    (set_cell("impl", 0, None), "line 2, column impl: '' is not allowed (every row names its impl)"),
])
def test_a_published_table_with_impossible_values_is_refused(tmp_path, good_run, edit, words):
    bad = shutil.copytree(good_run, tmp_path / "bad")
    (bad / run_folder.ROWS).unlink()
    table = pd.read_csv(bad / run_folder.TABLE)
    assert len(table) == 4 and table["median_us"].notna().all()
    edit(table).to_csv(bad / run_folder.TABLE, index=False)
    for args in (["summary", bad], ["compare", good_run, bad], ["plot", bad, "--out", tmp_path / "figs"]):
        r = invoke(*args)
        assert r.exit_code == 2 and f"{bad / run_folder.TABLE}: {words}" in r.output, (args, r.output)


def test_untimed_rows_read_with_an_empty_median(runs_in_every_state):
    table, _ = run_folder.load(runs_in_every_state["all-xfail"])  # a published folder of untimed rows
    assert len(table) and table["median_us"].isna().all()


@pytest.mark.slow
def test_plotting_a_single_point_keeps_stderr_clean(tmp_path):
    one = scenario(tmp_path, TINY.replace("window_left = [3, 15]", "window_left = 3"), "one.toml")
    assert invoke("run", one, "--device", "cpu", "--out", tmp_path / "run").exit_code == 0
    # in a process of its own (pytest catches warnings and logging itself), with a figure that says
    # what matplotlib says of a log axis of one point, through both of its channels
    code = textwrap.dedent(f"""
        import logging, sys, warnings
        from swabench import cli
        from swabench.publish import plots

        def warns(table, meta):
            warnings.warn("Attempt to set non-positive xlim on a log-scaled axis will be ignored.")
            logging.getLogger("matplotlib.ticker").warning("Data has no positive values: cannot be log-scaled")
            return plots.time_vs_window(table, meta)

        plots.FIGURES["time_vs_window"] = warns
        sys.argv = ["swabench", "plot", {str(tmp_path / "run")!r}, "--out", {str(tmp_path / "figs")!r}]
        cli.main()
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "" and "time_vs_window" in r.stdout, r.stderr
    assert (tmp_path / "figs" / "time_vs_window.png").exists()
