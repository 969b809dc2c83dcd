"""Which declared paths have run on a GPU: every implementation x storage x step the registry declares, the newest
run where it came through the gate on a GPU, why no case can run it, or a gap; a CPU run never counts."""

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY, invoke

from swabench.analysis import coverage
from swabench.core.cases import MODES
from swabench.impls import registry, tree_verify
from swabench.inputs import scenarios
from swabench.publish.sections import Run, by_key
from swabench.store import run_folder

H200_RUN = Path(__file__).resolve().parent / "fixtures" / "h200-run"  # a merge of two shards on H200s
# the committed runs, frozen to the paths that came through the gate on a GPU (tests/fixtures/make_coverage.py)
COMMITTED = Path(__file__).resolve().parent / "fixtures" / "coverage"


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A finished run of the tiny scenario on the CPU: torch-trim and the planted paths pass or are caught there."""
    folder = tmp_path_factory.mktemp("cpu")
    (folder / "tiny.toml").write_text(TINY)
    r = invoke("run", folder / "tiny.toml", "--out", folder / "run", "--device", "cpu")
    assert r.exit_code == 0, r.output
    return folder / "run"


def ran(folder: str, rows: list[tuple], device: str = "cuda:0", when: str = "2026-12-01T00:00:00+00:00",
        gpu: str = "NVIDIA H100 80GB HBM3") -> coverage.Ran:
    """A run of ``rows`` (impl, storage, mode, status) made on ``device``."""
    table = pd.DataFrame([dict(impl=i, storage=s, mode=m, status=st, device=device) for i, s, m, st in rows])
    return coverage.Ran(folder, table, {"device": device.split(":")[0], "gpu": gpu, "time_utc": when})


def row(rows, impl: str, storage: str, mode: str) -> coverage.Declared:
    return next(r for r in rows if (r.impl, r.storage, r.mode) == (impl, storage, mode))


def test_every_declared_path_is_a_row_in_registration_order():
    impls = registry.all_implementations()
    rows = coverage.coverage(impls, [])
    expected = [(i.name, s, m) for i in impls for s in i.storages for m in (i.modes or MODES)]
    assert [(r.impl, r.storage, r.mode) for r in rows] == expected
    assert row(rows, "decode-window", "paged", "decode").library == "flashinfer"
    assert {r.mode for r in rows if r.impl == "torch-trim"} == set(MODES)  # no modes declared: every step
    assert all(r.where == coverage.NEVER for r in rows if not r.cannot)


def test_the_fixture_run_fills_its_paths_and_leaves_the_rest_gaps():
    runs = [coverage.Ran(str(H200_RUN), *run_folder.load(H200_RUN))]
    rows = coverage.coverage(registry.all_implementations(), runs)
    assert row(rows, "paged-window", "paged", "verify").where == "`h200-run` (NVIDIA H200)"
    assert row(rows, "ragged-window", "ragged", "extend").run == "h200-run"
    assert row(rows, "paged-trim-causal", "paged", "draft_extend").run == "h200-run"  # a known bug caught: xfail
    assert row(rows, "ragged-window", "ragged", "decode").gap  # the fixture has no ragged decode
    assert row(rows, "fa4-window", "ragged", "extend").where == coverage.NEVER
    table = run_folder.load(H200_RUN)[0]
    through = table[coverage.came_through(table)]
    assert sum(bool(r.run) for r in rows) == len(set(zip(through["impl"], through["storage"], through["mode"])))


def test_a_gap_closes_when_a_gpu_run_passed_the_path():
    impls = [registry.get("torch-trim")]
    assert row(coverage.coverage(impls, []), "torch-trim", "ragged", "decode").gap
    closed = row(coverage.coverage(impls, [ran("runs/h100-x", [("torch-trim", "ragged", "decode", "pass")])]),
                 "torch-trim", "ragged", "decode")
    assert not closed.gap and closed.where == "`h100-x` (NVIDIA H100 80GB HBM3)"
    assert row(coverage.coverage(impls, [ran("h100-x", [("torch-trim", "ragged", "decode", "pass")])]),
               "torch-trim", "paged", "decode").gap  # another storage stays a gap


@pytest.mark.parametrize("impl, status, counts", [
    ("torch-trim", "pass", True), ("torch-trim", "xfail", False), ("torch-trim", "fail", False),
    ("torch-trim", "skip", False), ("planted-wide", "xfail", True), ("planted-wide", "pass", True),
    ("paged-plan-no-window", "xfail", True), ("paged-plan-no-window", "xpass", False),
    ("paged-plan-no-window", "fail", False)])
def test_what_counts_as_coming_through_the_gate(impl, status, counts):
    storage = registry.get(impl).storages[0]
    rows = coverage.coverage([registry.get(impl)], [ran("h100-x", [(impl, storage, "verify", status)])])
    assert (row(rows, impl, storage, "verify").run == "h100-x") is counts


def test_a_cpu_run_never_counts(cpu_run):
    table, meta = run_folder.load(cpu_run)
    assert meta["device"] == "cpu" and (table[table["impl"] == "torch-trim"]["status"] == "pass").any()
    rows = coverage.coverage(registry.all_implementations(), [coverage.Ran(str(cpu_run), table, meta)])
    assert not any(r.run for r in rows)
    assert row(rows, "torch-trim", "paged", "verify").where == coverage.NEVER
    unrecorded = coverage.Ran("old", table.assign(device=None), meta)  # rows without a device: the run's says
    assert not any(r.run for r in coverage.coverage([registry.get("torch-trim")], [unrecorded]))


def test_the_newest_gpu_run_is_named_whatever_the_order_given():
    path = ("torch-trim", "paged", "decode", "pass")
    older = ran("h200-old", [path], when="2026-11-01T00:00:00+00:00", gpu="NVIDIA H200")
    newer = ran("h100-new", [path], when="2026-12-01T00:00:00+00:00")
    for runs in ([older, newer], [newer, older]):
        assert row(coverage.coverage([registry.get("torch-trim")], runs), *path[:3]).run == "h100-new"


def test_a_path_no_case_can_run_says_why_instead_of_a_gap():
    rows = coverage.coverage(registry.all_implementations(), [])
    xqa = row(rows, "tree-xqa", "paged", "verify")
    assert xqa.cannot == tree_verify.XQA_REASON and not xqa.gap and xqa.where.startswith("cannot run: ")
    # refused at 16-token pages, run at one-token pages: a gap, not a path that cannot run
    assert row(rows, "tree-branches", "paged", "verify").gap
    assert coverage.refusal(registry.get("tree-branches"), "paged", "verify") is None
    assert {r.impl for r in rows if r.cannot} == {"tree-xqa", "tree-trtllm-gen"}


def test_a_declared_mode_must_be_a_step_a_scenario_can_make():
    impl = registry.get("torch-trim")
    with pytest.raises(AssertionError, match="modes and storages"):
        registry.register(dataclasses.replace(impl, name="prefill-step", modes=("prefill",)), __name__)
    with pytest.raises(AssertionError, match="modes and storages"):
        registry.register(dataclasses.replace(impl, name="flat-storage", storages=("flat",)), __name__)
    assert all(set(i.modes) <= set(MODES) for i in registry.all_implementations())


def test_the_section_builds_from_a_gpu_run_and_a_cpu_run(cpu_run):
    runs = [Run(str(H200_RUN), *run_folder.load(H200_RUN)), Run(str(cpu_run), *run_folder.load(cpu_run))]
    text = "\n".join(by_key("coverage").for_runs(runs))
    rows = coverage.coverage(registry.all_implementations(), runs)
    ran_here = sum(bool(r.run) for r in rows)
    assert f"{ran_here} of {len(rows)} declared paths" in text and "over these 2 runs" in text
    assert "| `paged-window` | flashinfer | paged | verify | `h200-run` (NVIDIA H200) |" in text
    assert "| `torch-trim` | torch | ragged | decode | never run on a GPU |" in text
    assert "`fa4-window` (paged extend, paged verify" in text  # the gaps named above the table
    assert text.count("\n| `") == len(rows)


def test_the_command_reads_a_folder_of_runs_and_refuses_one_without(cpu_run, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(H200_RUN, results / "h200-run")
    shutil.copytree(cpu_run, results / "cpu-run")
    (results / "calls").mkdir()  # logs: no meta.json, passed over
    (results / "calls" / "call1.log").write_text("log")
    r = invoke("coverage", results)
    assert r.exit_code == 0, r.output
    assert "| `paged-window` | flashinfer | paged | verify | `h200-run` (NVIDIA H200) |" in r.output
    gaps = invoke("coverage", results, "--gaps")
    assert "never run on a GPU" in gaps.output and "h200-run" not in gaps.output.split("\n", 1)[1]
    assert gaps.output.splitlines()[0] == r.output.splitlines()[0]
    bad = invoke("coverage", results / "calls")
    assert bad.exit_code == 2 and "neither a run folder nor a folder of run folders" in bad.output


@pytest.mark.slow
def test_the_coverage_scenario_runs_every_gap_of_the_committed_runs():
    """scenarios/coverage.toml makes a point, runnable on some GPU, of every path the committed runs (frozen in
    tests/fixtures/coverage) never ran."""
    rows = coverage.coverage(registry.all_implementations(), coverage.load([COMMITTED]))
    points = scenarios.load(scenarios.find("coverage")).points
    runnable = {(p.impl, p.case.storage, p.case.mode) for p in points
                if registry.get(p.impl).skip_reason(p.case, p.backend, None) is None}
    assert {(r.impl, r.storage, r.mode) for r in rows if r.gap} <= runnable
