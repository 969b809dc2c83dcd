"""The command line as a user meets it: end-to-end runs on the embedded backend, bad input, resume."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import TINY, cpu_only, invoke

from swabench.store import run_folder
from swabench.inputs import scenarios
from swabench.run import sweep



@pytest.fixture
def tiny(write_scenario):
    return write_scenario(TINY)


@pytest.mark.slow
def test_run_end_to_end_on_the_cpu(tiny, tmp_path):
    out = tmp_path / "run"
    r = invoke("run", tiny, "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "embedded backend" in r.output
    table = pd.read_csv(out / run_folder.TABLE)
    correct = table[table["impl"].isin(["torch-trim", "torch-mask"])]
    assert (correct["status"] == "pass").all() and (correct["median_us"] > 0).all()
    assert (correct["rel_l2"] < 1e-2).all() and (correct["tflops"] > 0).all()
    planted = table[table["impl"] == "planted-wide"]
    assert (planted["status"] == "xfail").all() and planted["median_us"].isna().all()
    fi = table[table["impl"] == "paged-window"]
    assert (fi["status"] == "skip").all() and fi["reason"].str.contains("needs CUDA").all()
    assert set(table["storage"]) == {"paged", "ragged"}
    for column in ["impl", "backend", "resolved_backend", "status", "mode", "storage", "batch_size",
                   "prefix_len", "qo_len", "window_left", "page_size", "num_qo_heads", "num_kv_heads",
                   "head_dim", "dtype", "rel_l2", "max_abs", "plan_us", "median_us", "iqr_us", "noise",
                   "eager_us", "tflops", "tbps"]:
        assert column in table.columns or column == "eager_us", column
    meta = json.loads((out / run_folder.META).read_text())
    assert meta["state"] == "complete" and meta["torch"] and meta["embedded_backend"]
    assert "host wall clock" in meta["method"]["kernel_time"]
    assert 0 <= meta["setup_s"] and 0 < meta["wall_s"] <= meta["total_s"]  # start-up recorded apart from the sweep
    assert (out / run_folder.SCENARIO).read_text() == TINY
    samples = pd.read_csv(out / run_folder.SAMPLES)
    assert set(samples["kind"]) == {"plan", "kernel"}


def test_check_is_gate_only(tiny, tmp_path):
    r = invoke("check", tiny, "--out", tmp_path / "c", "--device", "cpu", "--impl", "torch-trim", "--impl", "planted-wide")
    assert r.exit_code == 0, r.output
    table = pd.read_csv(tmp_path / "c" / run_folder.TABLE)
    assert set(table["impl"]) == {"torch-trim", "planted-wide"}
    assert "median_us" not in table or table["median_us"].isna().all()
    assert set(table["status"]) == {"pass", "xfail"}


@pytest.mark.slow
def test_interrupted_run_resumes_without_duplicating_or_losing_rows(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real, calls = sweep.measure_point, []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(sweep, "measure_point", interrupted)
    r = invoke("run", tiny, "--out", out, "--device", "cpu")
    assert r.exit_code == 130 and "--resume" in r.output
    kept = pd.read_csv(out / run_folder.TABLE)
    assert len(kept) >= 4
    monkeypatch.setattr(sweep, "measure_point", real)
    r = invoke("run", tiny, "--out", out, "--device", "cpu", "--resume")
    assert r.exit_code == 0, r.output
    said = re.search(r"sweep wall time ([\d.]+) s in this session \(([\d.]+) s since swabench started\), ([\d.]+) s "
                     r"over every session of this run folder", r.output)
    session, process, every = map(float, said.groups())
    assert session <= process and session <= every == json.loads((out / run_folder.META).read_text())["wall_s"]
    table = pd.read_csv(out / run_folder.TABLE)
    full = invoke("run", tiny, "--out", tmp_path / "full", "--device", "cpu")
    assert full.exit_code == 0
    expected = pd.read_csv(tmp_path / "full" / run_folder.TABLE)
    key = ["case_id", "impl", "backend"]
    assert not table.duplicated(key).any()
    assert sorted(map(tuple, table[key].values)) == sorted(map(tuple, expected[key].values))
    assert json.loads((out / run_folder.META).read_text())["state"] == "complete"


@pytest.mark.slow
@pytest.mark.parametrize("edit,words", [
    (("window_left = [3, 15]", "windw_left = [3, 15]"), ["windw_left", "unknown axis", "did you mean 'window_left'"]),
    (("window_left = [3, 15]", "window_left = [-3]"), ["window_left", "from -1 to 2147483647"]),
    (("storage = [", "page_size = 0\nstorage = ["), ["page_size", "from 1 to 65536"]),
    (("prefix_len = 40", "seq_len = 2"), ["draft_tokens", "larger than seq_len 2"]),
    (('"torch-mask"', '"torch-msak"'), ["unknown implementation 'torch-msak'", "did you mean 'torch-mask'"]),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, tiny, edit, words):
    out = tmp_path / "existing"
    assert invoke("run", tiny, "--out", out, "--device", "cpu", "--impl", "torch-trim").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace(*edit))
    for command in ("run", "check", "show"):
        args = [command, bad] + (["--out", out, "--resume"] if command != "show" else [])
        r = invoke(*args)
        assert r.exit_code == 2, (command, r.output)
        assert str(bad) in r.output and all(w in r.output for w in words), r.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_existing_run_is_never_overwritten(tiny, tmp_path):
    out = tmp_path / "run"
    invoke("run", tiny, "--out", out, "--device", "cpu", "--impl", "torch-trim")
    before = (out / run_folder.ROWS).read_bytes()
    r = invoke("run", tiny, "--out", out, "--device", "cpu")
    assert r.exit_code == 2 and "already holds a run" in r.output
    assert (out / run_folder.ROWS).read_bytes() == before


def test_unreadable_file_and_unknown_scenario(tmp_path):
    r = invoke("run", tmp_path / "nope.toml", "--device", "cpu")
    assert r.exit_code == 2 and "cannot read it" in r.output
    r = invoke("show", "defualt")
    assert r.exit_code == 2 and "did you mean 'default'" in r.output


@cpu_only
def test_cuda_requested_without_a_gpu(tiny):
    r = invoke("run", tiny, "--device", "cuda")
    assert r.exit_code == 2 and "no CUDA device" in r.output
    r = invoke("warmup", "default", "serving")  # several scenarios at once
    assert r.exit_code == 2 and "no CUDA device" in r.output


def test_warmup_lists_what_a_gpu_node_would_build_without_a_gpu():
    r = invoke("warmup", "release", "--list")
    assert r.exit_code == 0, r.output
    head, *lines = r.output.strip().splitlines()
    assert head.startswith(f"{len(lines)} module signatures") and len(set(lines)) == len(lines)
    assert "  sink-window fa2 bfloat16 d128 window sinks" in lines  # the second head_dim, fa2 only
    assert "  sink-window fa3 bfloat16 d128 window sinks" not in lines
    assert not any(line.split()[0].startswith(("torch-", "flex-")) for line in lines)  # nothing to build


def test_warmup_of_a_scenario_with_nothing_to_build_says_so_without_a_gpu(tiny):
    """The cpu scenario runs plain PyTorch alone: nothing to build is no error, GPU or none."""
    for args in (["cpu"], ["cpu", "--list"], [tiny, "--impl", "torch-trim"]):
        r = invoke("warmup", *args)
        assert r.exit_code == 0 and r.output.startswith("nothing to build: no point of ") and \
            "needs a JIT-compiled module" in r.output, r.output


def test_warmup_checks_every_scenario_before_building():
    r = invoke("warmup", "default", "defualt")
    assert r.exit_code == 2 and "did you mean 'default'" in r.output
    assert invoke("warmup").exit_code == 2  # at least one scenario


def test_show_list_env(tiny):
    r = invoke("show", tiny)
    assert r.exit_code == 0 and "8 cases, 28 points" in r.output and "torch-trim" in r.output
    r = invoke("list")
    assert r.exit_code == 0 and "paged-window" in r.output and "cpu" in r.output
    r = invoke("env")
    assert r.exit_code == 0 and "torch" in r.output and "implementations usable here" in r.output


@cpu_only
def test_run_without_scenario_runs_cpu_toml_on_a_cpu_machine(tmp_path, monkeypatch):
    """One point of cpu.toml is enough: run with another scenario, its case id would match nothing."""
    case = scenarios.load(scenarios.find("cpu")).cases[0]
    monkeypatch.chdir(tmp_path)
    r = invoke("run", "--case", case.case_id, "--impl", "torch-trim")
    assert r.exit_code == 0, r.output
    assert "running cpu.toml" in r.output and "embedded backend" in r.output
    (run,) = (tmp_path / "runs").iterdir()
    table = pd.read_csv(run / run_folder.TABLE)
    assert table["impl"].tolist() == ["torch-trim"] and table["backend"].tolist() == ["torch"]
    assert (table["status"] == "pass").all() and (table["median_us"] > 0).all()


def test_exit_status_fail_is_fatal_xpass_only_with_strict(tiny, tmp_path, monkeypatch):
    """A correct implementation that fails exits 1; a known bug that passes is a loud finding, fatal
    only with --strict."""
    from swabench.core import semantics
    from swabench.impls import embedded, registry

    trim = registry.get("torch-trim")
    wrong = registry.Implementation("torch-wrong", "torch", trim.storages, "window too wide",
                                    embedded._gather(lambda w, p, ps: semantics.Visibility(w + 1), True))
    fixed_bug = registry.Implementation("torch-fixed-bug", "torch", trim.storages, "bug fixed upstream",
                                        trim.make, kind="known-bug",
                                        visibility=lambda w, p, ps: semantics.Visibility(w + 1))
    monkeypatch.setitem(registry._REGISTRY, "torch-wrong", wrong)
    monkeypatch.setitem(registry._REGISTRY, "torch-fixed-bug", fixed_bug)
    for impl, strict, code, status in [("torch-wrong", False, 1, "fail"), ("torch-fixed-bug", False, 0, "xpass"),
                                       ("torch-fixed-bug", True, 1, "xpass")]:
        path = tmp_path / f"{impl}.toml"
        path.write_text(TINY.replace('"torch-trim", "torch-mask", "planted-wide", "paged-window"', f'"{impl}"'))
        out = tmp_path / f"{impl}-{strict}"
        r = invoke("check", path, "--out", out, "--device", "cpu", *(["--strict"] if strict else []))
        assert r.exit_code == code, r.output
        assert status.upper() in r.output
        assert set(pd.read_csv(out / run_folder.TABLE)["status"]) == {status}
        summary = invoke("summary", out)
        assert summary.exit_code == 0 and f"| {impl} |" in summary.output


@pytest.mark.slow
def test_summary_of_a_timed_run(tiny, tmp_path):
    out = tmp_path / "run"
    assert invoke("run", tiny, "--out", out, "--device", "cpu", "--impl", "torch-trim", "--impl", "torch-mask").exit_code == 0
    r = invoke("summary", out)
    assert r.exit_code == 0
    assert "| torch-trim | correct | torch | 8 | 0 |" in r.output  # 8 points, all passed
    assert "timed points" in r.output and "| verify | torch-mask | torch | 4 |" in r.output
    assert "JIT warm-up not measured;" in r.output and "None" not in r.output  # a CPU run builds no JIT module


@pytest.mark.slow
def test_without_a_terminal_progress_is_a_plain_line_every_5_percent(tiny, tmp_path):
    import re

    r = invoke("run", tiny, "--out", tmp_path / "run", "--device", "cpu")  # CliRunner's stderr is not a TTY
    assert r.exit_code == 0, r.output
    lines = re.findall(r"^run: (\d+)/(\d+) points \((\d+)%\), (\d+) fail, (\d+) xpass, \d+ s$", r.output, re.M)
    total = len(pd.read_csv(tmp_path / "run" / run_folder.TABLE))
    assert 2 <= len(lines) <= 21 and lines[-1] == (str(total), str(total), "100", "0", "0"), r.output
    done = [int(line[0]) for line in lines]
    assert done == sorted(done) and all(int(t) == total for _, t, *_ in lines)


def test_compare_flags_exactly_the_slowed_implementation(tiny, tmp_path, monkeypatch):
    """Two runs of the same scenario; in the second, torch-mask is made 30x slower: compare must
    flag that one implementation and exit 1 (a CI gate), and nothing else."""
    from swabench.measure import timing

    def host_time(slowed):
        """Samples that depend on the runner alone: a loaded 2-core machine cannot move them."""
        def fake(fn, sync=None, options=None):
            fn()  # plan() must still plan
            factor = 30.0 if slowed and fn.__name__ == "run" and not fn.__self__.trim else 1.0  # torch-mask
            return timing.Timing([factor * (100 + i % 7) for i in range(21)], "fixed samples")
        return fake

    args = ["--device", "cpu", "--impl", "torch-trim", "--impl", "torch-mask"]
    monkeypatch.setattr(timing, "host_time", host_time(False))
    assert invoke("run", tiny, "--out", tmp_path / "base", *args).exit_code == 0
    monkeypatch.setattr(timing, "host_time", host_time(True))
    assert invoke("run", tiny, "--out", tmp_path / "new", *args).exit_code == 0
    r = invoke("compare", tmp_path / "base", tmp_path / "new", "--threshold", "2.0", "--format", "json")
    assert r.exit_code == 1
    flagged = {(p["impl"], p["verdict"]) for p in json.loads(r.output) if p["verdict"] != "same"}
    assert flagged == {("torch-mask", "regression")}
    same = invoke("compare", tmp_path / "base", tmp_path / "base")
    assert same.exit_code == 2 and "the same run folder" in same.output


@pytest.mark.slow
def test_sigterm_keeps_finished_rows_and_resume_completes(tmp_path):
    """A scheduler's SIGTERM (Slurm, timeout) ends the run like Ctrl-C: rows kept, table written."""
    import signal
    import subprocess
    import sys
    import time

    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)  # 28 points, about 1.5 s after the first row on 2 cores: still running at the signal
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "swabench", "run", str(scenario), "--device", "cpu",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline and not ((out / run_folder.ROWS).exists() and (out / run_folder.ROWS).stat().st_size):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130, output
    total = len(scenarios.load(scenario).points)
    kept = pd.read_csv(out / run_folder.TABLE)
    assert 1 <= len(kept) < total and json.loads((out / run_folder.META).read_text())["state"] == "interrupted"
    r = invoke("run", scenario, "--device", "cpu", "--out", out, "--resume")
    assert r.exit_code == 0
    assert len(pd.read_csv(out / run_folder.TABLE)) == total


def test_the_command_line_starts_without_torch_pandas_or_pyplot():
    """`swabench --help` and the --gpus launcher import only what they use: the launcher starts its
    workers before importing torch (4 s on the H200 node), and pyplot waits for a figure."""
    code = ("import sys, swabench.cli; heavy = [m for m in ('torch', 'pandas', 'matplotlib.pyplot') "
            "if m in sys.modules]; sys.exit(', '.join(heavy) or None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"imported at start: {done.stderr}"


def test_a_case_whose_every_point_skips_builds_no_workload(tiny, write_scenario, tmp_path, monkeypatch):
    """On the CPU a FlashInfer path skips whatever the data: a case where only it runs never has its workload
    built, and its rows hold the same counts as those of a case that was built."""
    from swabench.core import workloads
    built, real = [], workloads.build
    monkeypatch.setattr(workloads, "build", lambda case, device: built.append(case) or real(case, device))
    apart = write_scenario(TINY + "[[skip]]\nwhen = \"impl == 'torch-trim' and storage == 'paged'\"\n", "apart.toml")
    r = invoke("check", apart, "--out", tmp_path / "c", "--device", "cpu", "--impl", "paged-window",
               "--impl", "torch-trim")
    assert r.exit_code == 0, r.output
    table = pd.read_csv(tmp_path / "c" / run_folder.TABLE)
    skipped = table[table["impl"] == "paged-window"].reset_index(drop=True)
    assert {c.storage for c in built} == {"ragged"} and len(skipped) == 4
    assert skipped["reason"].str.contains("needs CUDA").all()
    built.clear()
    r = invoke("check", tiny, "--out", tmp_path / "both", "--device", "cpu", "--impl", "paged-window",
               "--impl", "torch-trim")
    assert r.exit_code == 0 and {c.storage for c in built} == {"paged", "ragged"}  # a point that runs: built
    both = pd.read_csv(tmp_path / "both" / run_folder.TABLE)
    counts = ["case_id", "status", "reason", "total_qo", "total_kv", "pairs", "flops", "min_bytes", "min_read_bytes",
              "must_fail"]
    assert skipped[counts].equals(both[both["impl"] == "paged-window"][counts].reset_index(drop=True))
