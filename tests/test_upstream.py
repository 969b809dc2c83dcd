"""Upstream bugs declared in one place: inside a declared condition a correct path's failure is xfail with
the issue recorded, outside it still a failure that exits 1; and a path whose API a release lacks skips
naming the release."""

import re

import pandas as pd
import torch
import pytest
from conftest import TINY, invoke

from swabench.core import semantics
from swabench.impls import embedded, flashinfer_impls, flashinfer_library, registry, upstream
from swabench.run.sweep import verdict
from swabench.inputs import axes
from swabench.store import run_folder


def test_verdict_of_a_correct_path_inside_a_declared_condition():
    bug = upstream.UpstreamBug("lib#1", "", "torch", "wrong at W = 3", frozenset({"x"}), lambda i, c, b: True)
    assert verdict(False, False, False, bug) == ("xfail", "upstream bug lib#1: wrong at W = 3")
    assert verdict(False, False, True, bug) == ("pass", "lib#1 declared here, not shown")
    assert verdict(False, False, False) == ("fail", "")


@pytest.fixture
def wrong_at_w3(monkeypatch):
    """A 'correct' path whose window is one key too wide, and a bug declared on it where W = 3."""
    trim = registry.get("torch-trim")
    wrong = registry.Implementation("torch-wrong", "torch", trim.storages, "window too wide",
                                    embedded._gather(lambda w, p, ps: semantics.Visibility(w + 1), True))
    monkeypatch.setitem(registry._REGISTRY, "torch-wrong", wrong)
    declared = upstream.declared() + [upstream.UpstreamBug("lib#7", "https://example.org/7", "torch", "too wide at W 3",
                                                           frozenset({"torch-wrong", "torch-trim"}),
                                                           lambda impl, case, backend: case.window_left == 3)]
    monkeypatch.setattr(upstream, "_DECLARED", declared)


def test_a_failure_inside_the_condition_is_xfail_and_outside_it_still_exits_1(tmp_path, wrong_at_w3):
    path = tmp_path / "t.toml"
    path.write_text(TINY.replace('"torch-trim", "torch-mask", "planted-wide", "paged-window"',
                                 '"torch-wrong", "torch-trim"'))
    r = invoke("check", path, "--out", tmp_path / "run", "--device", "cpu")
    assert r.exit_code == 1, r.output
    t = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    wrong, trim = t[t["impl"] == "torch-wrong"], t[t["impl"] == "torch-trim"]
    assert set(zip(wrong["window_left"], wrong["status"], wrong["upstream"].fillna(""))) == {
        (3, "xfail", "lib#7"), (15, "fail", "")}
    assert wrong[wrong["status"] == "xfail"]["reason"].str.startswith("upstream bug lib#7: too wide at W 3").all()
    assert set(zip(trim["window_left"], trim["status"], trim["upstream"].fillna(""))) == {
        (3, "pass", "lib#7"), (15, "pass", "")}  # the condition held and the path passed: recorded, not shown
    only_w3 = tmp_path / "w3.toml"
    only_w3.write_text(path.read_text().replace("window_left = [3, 15]", "window_left = 3"))
    assert invoke("check", only_w3, "--out", tmp_path / "w3", "--device", "cpu").exit_code == 0


def test_the_sink_module_condition_needs_two_head_dims_in_one_process(monkeypatch):
    monkeypatch.setattr(flashinfer_library, "SINK_HEAD_DIMS", {})
    case = lambda d: axes.make_case(dict(mode="verify", draft_tokens=4, prefix_len=40, window_left=15, sinks=True,  # noqa
                                         num_qo_heads=8, num_kv_heads=8, head_dim=d))
    hit = lambda c, backend="fa2": upstream.hit("sink-window", c, backend)  # noqa: E731
    key = flashinfer_library._sink_module(case(64), "fa2")
    flashinfer_library.SINK_HEAD_DIMS[key] = {64}
    assert hit(case(64)) is None and hit(case(128)) is None
    flashinfer_library.SINK_HEAD_DIMS[key].add(128)
    assert hit(case(64)).ref == hit(case(128)).ref == "flashinfer#1679"
    assert hit(case(128), "fa3") is None  # another backend is another module
    assert upstream.hit("paged-window", case(128), "fa2") is None  # only the paths it names


def test_every_declaration_names_registered_paths_and_a_link_or_how_to_file_it():
    from swabench.repro import filings

    names = set(registry.names())
    for bug in upstream.declared():
        assert bug.impls <= names and bug.summary
        if bug.documented:  # the caller's to meet: cited, not filed
            assert bug.ref not in filings.FILINGS and re.search(r"\.py:\d+", bug.documented), bug.ref
            continue
        filing = filings.FILINGS[bug.ref]
        assert filing.kind in filings.KINDS and filing.fault, bug.ref
        assert bug.url.startswith("https://") or filing.kind == "FlashInfer bug" and filing.ask, bug.ref


def test_a_path_whose_api_the_release_lacks_skips_naming_the_release(monkeypatch):
    import sys
    import types

    class Paged:
        def __init__(self, workspace, layout="NHD", backend="auto"): ...
        def plan(self, qo_indptr, window_left=-1): ...
        def run(self, q, kv, out=None): ...  # no sinks keyword

    fake = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=Paged)
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(flashinfer_impls, "_import_error", lambda: None)
    monkeypatch.setattr(registry.Library, "version", lambda self: "0.5.0")
    drop = flashinfer_impls.Variant("paged", sinks="drop")
    assert flashinfer_impls.missing_api(flashinfer_impls._needs(drop))() == \
        "flashinfer 0.5.0's BatchPrefillWithPagedKVCacheWrapper.run takes no sinks"
    sink = flashinfer_impls.Variant("paged", sinks="apply")
    assert flashinfer_impls.missing_api(flashinfer_impls._needs(sink))() == \
        "flashinfer 0.5.0 has no BatchAttentionWithAttentionSinkWrapper"
    assert flashinfer_impls.missing_api(flashinfer_impls._needs(flashinfer_impls.Variant("paged")))() is None


def test_the_release_recorded_is_the_one_that_runs(monkeypatch):
    """Two releases' package records in one folder (one unpacked over the other): the module's own
    __version__ names the release that runs."""
    import importlib.metadata
    import sys
    import types

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.7.4")
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.7.2.post1"))
    assert flashinfer_impls.LIBRARY.version() == "0.7.2.post1"
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace())
    assert flashinfer_impls.LIBRARY.version() == "0.7.4"


def test_the_warm_up_builds_the_sink_wrappers_head_dims_one_after_another():
    """Before 0.7.4 both head_dims build one file: built at once, one process loads what the other replaces."""
    from swabench.run.sweep import build_groups, module_signature
    from swabench.inputs import scenarios

    s = scenarios.load(scenarios.find("release"))
    todo = {module_signature(p): p for p in s.points if registry.get(p.impl).needs_cuda}
    groups = build_groups(todo)
    sinks = [g for g in groups if any(p.impl == "sink-window" for _, p in g)]
    assert sorted(sorted(p.case.head_dim for _, p in g) for g in sinks) == [[64], [64, 128]]  # fa3: 64; fa2: both
    assert all(len(g) == 1 for g in groups if g not in sinks) and sum(map(len, groups)) == len(todo)


def test_a_path_that_raises_is_a_failed_point_with_its_error_and_xfail_inside_a_declared_condition(tmp_path,
                                                                                                 monkeypatch):
    trim = registry.get("torch-trim")

    def crashing(w, backend):
        raise ValueError("Q and KV block size must be divisible by BLOCK_M and BLOCK_N")
    monkeypatch.setitem(registry._REGISTRY, "torch-crash", registry.Implementation(
        "torch-crash", "torch", trim.storages, "raises", crashing))
    monkeypatch.setattr(upstream, "_DECLARED", upstream.declared() + [upstream.UpstreamBug(
        "lib#9", "", "torch", "raises at W 3", frozenset({"torch-crash"}), lambda impl, case, backend:
        case.window_left == 3)])
    path = tmp_path / "t.toml"
    path.write_text(TINY.replace('"torch-trim", "torch-mask", "planted-wide", "paged-window"', '"torch-crash"'))
    r = invoke("check", path, "--out", tmp_path / "run", "--device", "cpu")
    assert r.exit_code == 1, r.output
    t = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    assert set(zip(t["window_left"], t["status"])) == {(3, "xfail"), (15, "fail")}
    assert t["reason"].str.endswith("ValueError: Q and KV block size must be divisible by BLOCK_M and BLOCK_N").all()
    assert t[t["status"] == "xfail"]["reason"].str.startswith("upstream bug lib#9").all()


class UnbuiltRunner:
    """A FlashInfer path whose module builds on its first call, as XQA's and fmha v2's do, and fails there."""

    def __init__(self, w, backend):
        self.out, self.resolved_backend = torch.empty_like(w.q), backend

    def plan(self):
        pass

    def run(self):
        raise RuntimeError("Ninja build failed. Ninja output:\nninja: error: '/s/flashinfer/data/csrc/xqa/mha.cu', "
                           "needed by 'xqa_mha.cuda.o', missing and no known rule to make it")


def unbuilt_path(monkeypatch, library="flashinfer"):
    trim = registry.get("torch-trim")
    monkeypatch.setitem(registry._REGISTRY, "fi-unbuilt", registry.Implementation(
        "fi-unbuilt", library, trim.storages, "its module will not build", UnbuiltRunner))


@pytest.mark.parametrize("library,status", [("flashinfer", "skip"), ("torch", "fail")])
def test_a_module_that_would_not_build_on_its_first_call_is_a_skip_with_the_library_message(tmp_path, monkeypatch,
                                                                                            library, status):
    """Past plan(), on run(): the sweep still skips such a point, asking the path's own library (a torch path's
    error is its own failure, whatever it says)."""
    unbuilt_path(monkeypatch, library)
    path = tmp_path / "t.toml"
    path.write_text(TINY.replace('"torch-trim", "torch-mask", "planted-wide", "paged-window"', '"fi-unbuilt"'))
    r = invoke("check", path, "--out", tmp_path / "run", "--device", "cpu")
    assert r.exit_code == (2 if status == "skip" else 1), r.output  # every point a skip: nothing ran
    t = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    assert set(t["status"]) == {status}
    if status == "skip":
        assert t["reason"].str.startswith("resource: Ninja build failed. Ninja output: ... ninja: error: ").all()


def test_the_warm_up_remembers_a_module_that_would_not_build_so_its_points_skip(monkeypatch):
    import dataclasses

    from swabench.inputs import scenarios
    from swabench.run import sweep

    unbuilt_path(monkeypatch)
    point = next(p for p in scenarios.load(scenarios.find("cpu")).points if p.impl == "torch-trim")
    point = dataclasses.replace(point, impl="fi-unbuilt")
    monkeypatch.setattr(sweep, "modules_needed", lambda pts, device: {"sig": point})
    report = sweep.warm_up([point], torch.device("cpu"))
    assert report.failed == {"sig": "RuntimeError: Ninja build failed. Ninja output: ... ninja: error: "
                                    "'/s/flashinfer/data/csrc/xqa/mha.cu', needed by 'xqa_mha.cuda.o', missing and no "
                                    "known rule to make it"}


def test_the_warm_up_tells_each_build_as_it_ends(monkeypatch):
    """A warm-up cut short by a timeout must still have said which modules were built, and how long each took."""
    from swabench.inputs import scenarios
    from swabench.run import sweep

    s = scenarios.load(scenarios.find("cpu"))
    points = [p for p in s.points if p.impl == "torch-trim"][:2]
    monkeypatch.setattr(sweep, "modules_needed", lambda pts, device: {f"sig{i}": p for i, p in enumerate(pts)})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the CPU has nothing to wait for
    heard = []
    report = sweep.warm_up(points, torch.device("cpu"), jobs=2, on_built=lambda *said: heard.append(said))
    assert sorted(label for label, _, _ in heard) == ["sig0", "sig1"] == sorted(report.seconds)
    assert all(seconds >= 0 and error is None for _, seconds, error in heard)


def test_the_warm_up_tells_a_build_that_failed_for_another_reason(monkeypatch):
    from swabench.inputs import scenarios
    from swabench.run import sweep

    point = next(p for p in scenarios.load(scenarios.find("cpu")).points if p.impl == "torch-trim")
    monkeypatch.setattr(sweep, "modules_needed", lambda pts, device: {"sig": point})
    monkeypatch.setattr(sweep.workloads, "build", lambda case, device: (_ for _ in ()).throw(ValueError("nvcc: boom")))
    heard = []
    report = sweep.warm_up([point], torch.device("cpu"), on_built=lambda *said: heard.append(said))
    assert heard[0][2] == "ValueError: nvcc: boom (left to its points)" and report.failed == {}  # its points meet it, not skip
