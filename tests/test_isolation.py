"""The supervisor (swabench.run.isolation): a worker that segfaults, aborts, hangs past its limit or exits without an
answer costs its point, recorded as crash with how it ended, and the sweep goes on; a resume leaves crashed points
alone unless asked; the journal names the point a run ended inside; a build that kills its worker is a named skip."""

import json

import pytest
import torch

from conftest import invoke
from swabench.cli import options
from swabench.run import isolation, lifecycle, sweep
from swabench.store import run_folder

CRASHES = ["crash-abort", "crash-segfault", "crash-exit", "crash-hang"]


CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def supervised(monkeypatch):
    """The points of these tests run in a supervised worker, as a command's do by default."""
    monkeypatch.delenv(isolation.IN_PROCESS)


def crash_scenario(*impls, cases=()):
    return options.load("crash", list(impls), list(cases), "cpu")


def one_case(impls, tmp_path, **request):
    """The crash scenario's decode case through ``impls``, run into tmp_path/run with a short point limit."""
    s = crash_scenario(*impls, cases=["decode"])
    req = lifecycle.Request(s, tmp_path / "run", CPU, limits=isolation.Limits(point_s=request.pop("point_s", 20)),
                            **request)
    return s, lifecycle.execute(req)


@pytest.mark.slow
def test_each_way_a_worker_ends_costs_its_point_only(tmp_path):
    s, outcome = one_case(["torch-trim", *CRASHES, "torch-mask"], tmp_path, point_s=8)
    rows = {r["impl"]: r for r in run_folder.read_rows(outcome.folder)}
    assert outcome.state == "complete" and set(rows) == {"torch-trim", "torch-mask", *CRASHES}
    assert rows["torch-trim"]["status"] == rows["torch-mask"]["status"] == "pass"  # the points around the crashes
    assert rows["torch-mask"]["median_us"] > 0
    said = {impl: rows[impl]["reason"] for impl in CRASHES}
    assert all(rows[impl]["status"] == "crash" for impl in CRASHES)
    assert "SIGABRT" in said["crash-abort"] and "planted_crashes.py" in said["crash-abort"]  # faulthandler's frames
    assert "SIGSEGV" in said["crash-segfault"]
    assert "exited with status 0 without an answer" in said["crash-exit"]
    assert "hung: it answered nothing in 8 s" in said["crash-hang"]
    assert outcome.exit_status() == 0  # planted paths crashing is what they are for: no correct path crashed
    assert "4 points crashed" in " ".join(text for text, _ in outcome.messages(False, "again"))


@pytest.mark.slow
def test_resume_leaves_crashed_points_unless_asked(tmp_path):
    s, first = one_case(["torch-trim", "crash-exit"], tmp_path)
    assert first.count("crash") == 1
    lines = (first.folder / run_folder.ROWS).read_text().splitlines()
    again = lifecycle.execute(lifecycle.Request(s, first.folder, CPU, resume=True))
    assert (first.folder / run_folder.ROWS).read_text().splitlines() == lines  # nothing ran again
    assert again.count("crash") == 1
    retried = lifecycle.execute(lifecycle.Request(s, first.folder, CPU, resume=True,
                                                  retry_crashed=True))
    ran = [json.loads(line) for line in (first.folder / run_folder.ROWS).read_text().splitlines()[len(lines):]]
    assert [r["impl"] for r in ran] == ["crash-exit"]  # the crashed point, and only it, ran again
    starts = [json.loads(line)["impl"] for line in (first.folder / run_folder.STARTED).read_text().splitlines()]
    assert sorted(starts) == ["crash-exit", "crash-exit", "torch-trim"]
    assert retried.count("crash") == 1 and retried.count("pass") == 1


def test_a_crashed_correct_path_exits_1():
    import pandas as pd

    table = pd.DataFrame({"status": ["pass", "crash"], "kind": ["correct", "planted"]})
    assert lifecycle.gate_status(table) == 0
    table.loc[1, "kind"] = "correct"
    assert lifecycle.gate_status(table) == 1


def test_the_journal_names_the_point_a_run_ended_inside(tmp_path):
    s = crash_scenario("torch-trim")
    store = run_folder.RunStore.create(tmp_path / "run", {"what": "run", "state": "running"}, s.text)
    first, second = s.points[:2]
    store.start(first)
    row = isolation.crash_row(first, CPU, "crash: test")
    store.append(row)
    store.start(second)
    assert store.unfinished() == [second.key]
    assert [r["impl"] for r in store.rows()] == [first.impl]
    store.start(first)  # run again (--retry-crashed): begun twice, one row
    assert store.unfinished() == [first.key, second.key]
    assert store.done() == {first.key} and store.done(again=("crash",)) == set()
    store.close()


def test_last_words_quote_the_fatal_line_and_innermost_frames():
    log = ("terminate called after throwing an instance of 'std::runtime_error'\n  what():  bad\n"
           "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
           '  File "/x/y/lib.py", line 7 in compile\n  File "/x/z/run.py", line 3 in plan\n\nExtension modules: a, b\n')
    said = isolation.last_words(log)
    assert said.startswith("terminate called") and "what():  bad" in said
    assert "Fatal Python error: Aborted at lib.py:7 compile < run.py:3 plan" in said
    assert "Extension modules" not in said and "/x/y" not in said
    assert isolation.last_words("one\ntwo\n") == "one | two"
    assert isolation.exit_words(-11) == "was killed by SIGSEGV (signal 11)" and isolation.exit_words(3) == \
        "exited with status 3"


@pytest.mark.parametrize("how", ["dies", "poisons"])
def test_a_build_that_kills_its_worker_is_named_and_the_rest_build(monkeypatch, how):
    """Three signatures built at once; the worker dies with all three in flight (or, poisoning the GPU, says so once
    it is done, b and c having raised); each suspect is built again on its own, and only the one that kills or
    poisons is named (a crash), not the others."""
    three = crash_scenario("torch-trim").points[:3]
    label_of = {id(p): label for p, label in zip(three, "abc")}
    monkeypatch.setattr(sweep, "modules_needed", lambda points, device: {label_of[id(p)]: p for p in three})

    class FakeWorker:
        """Answers a warm-up request as a worker would; dies whenever it is asked to build b."""

        def __init__(self):
            self.sent, self.process, self.steps = [], type("P", (), {"poll": lambda self: None})(), iter(())

        def send(self, message):
            self.sent.append(message)
            labels = [label_of[id(p)] for p in message[1]]
            warm = sweep.WarmUp(dict.fromkeys(labels, 1.0), [], 1.0, message[3], None, {})
            if how == "dies":
                ends = [isolation.WorkerDied("was killed by SIGSEGV (signal 11)")] if "b" in labels else \
                    [("built", label, 1.0, None) for label in labels] + [("done", warm, None)]
            else:  # c raises once b has poisoned the context
                ends = [("built", label, 1.0, "AcceleratorError: illegal memory access" if label in "bc" and "b" in
                         labels else None) for label in labels] + \
                    [("done", warm, "AcceleratorError: illegal memory access" if "b" in labels else None)]
            self.steps = iter([("building", label) for label in labels] + ends)

        def receive(self, limit_s, doing):
            step = next(self.steps)
            if isinstance(step, Exception):
                raise step
            return step

        def close(self):
            pass

    workers = []
    monkeypatch.setattr(isolation, "Worker", lambda: workers.append(FakeWorker()) or workers[-1])
    warm = isolation.Supervisor(sweep.SweepOptions(device=CPU)).warm_up(three, jobs=8)
    said = "the build killed its process (the worker was killed by SIGSEGV" if how == "dies" else \
        "the build left the GPU unusable (AcceleratorError"
    assert list(warm.failed) == ["b"] and said in warm.failed["b"]
    assert set(warm.seconds) == {"a", "b", "c"}
    jobs = [m[3] for w in workers for m in w.sent]
    assert jobs[0] == 8 and jobs[1:] == ([1, 1, 1] if how == "dies" else [1, 1])  # then each suspect on its own


@pytest.mark.slow
def test_run_cli_says_crash_and_in_process_option(tmp_path):
    out = tmp_path / "run"
    result = invoke("run", "crash", "--impl", "torch-trim", "--impl", "crash-segfault", "--case", "decode",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert "CRASH crash-segfault" in result.output and "SIGSEGV" in result.output
    refused = invoke("run", "crash", "--retry-crashed", "--out", tmp_path / "other")
    assert refused.exit_code == 2 and "--retry-crashed" in refused.output


def test_the_environment_keeps_points_in_process(monkeypatch):
    assert isolation.isolated_by_default() and lifecycle.Request(None, None, CPU).in_worker
    monkeypatch.setenv(isolation.IN_PROCESS, "1")
    assert not isolation.isolated_by_default() and not lifecycle.Request(None, None, CPU).in_worker
    assert not lifecycle.Request(None, None, CPU, isolated=True, counted=True).in_worker  # ncu counts one process
