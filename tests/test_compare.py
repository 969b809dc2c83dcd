import json
import random
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import invoke

from swabench.analysis import compare
from swabench.store import run_folder
from swabench.store.run_folder import RunStore


def test_mann_whitney_matches_the_asymptotic_reference():
    # scipy.stats.mannwhitneyu(..., method="asymptotic") gives U=17, p=0.11134688653314041 and U=3.5, p=0.0047933...
    u, p = compare.mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert u == 17 and abs(p - 0.11134688653314041) < 1e-12
    u, p = compare.mann_whitney_u([1, 2, 2, 3, 3, 3, 4], [3, 4, 4, 5, 5, 6, 7, 7])
    assert u == 3.5 and abs(p - 0.004793348746185457) < 1e-12


def fake_run(folder, medians: dict, gpu="NVIDIA H200", status=None, seed=0, scenario="synthetic",
             case_id="c1", state="complete", throttled=()):
    """A run folder whose kernel samples are drawn around the given medians (1% jitter); a median of
    None is a point that was not timed; ``throttled``: the implementations timed under a throttle."""
    rng = random.Random(seed)
    store = RunStore.create(folder, {"gpu": gpu, "scenario": scenario}, scenario)
    for impl, median in medians.items():
        row = {"case_id": case_id, "case": f"verify {case_id}", "impl": impl, "backend": "fa2",
               "status": (status or {}).get(impl, "pass"), "throttled": impl in throttled}
        if median is not None:
            samples = [median * (1 + rng.uniform(-0.01, 0.01)) for _ in range(40)]
            row.update(median_us=sorted(samples)[20], samples={"kernel": samples})
        store.append(row)
    store.finalize(state=state)
    return folder


def test_verdicts_on_synthetic_samples(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}, seed=1)
    new = fake_run(tmp_path / "new", {"a": 10.0, "b": 24.0, "c": 21.0, "d": 40.4}, seed=2,
                   status={"d": "pass"})
    c = compare.compare(base, new)
    verdicts = dict(zip(c.table["impl"], c.table["verdict"]))
    assert verdicts == {"a": "same", "b": "regression", "c": "improvement", "d": "same"}  # d: 1% is under 5%
    assert list(c.table["verdict"])[:2] == ["regression", "improvement"]  # listed first
    assert json.loads(compare.to_json(c))[0]["impl"] == "b"
    assert (c.joined, c.only_base, c.only_new, c.regressions, c.warnings) == (4, 0, 0, 1, [])
    text = compare.to_markdown(c, 0.05, 0.01)
    assert "4 points joined (0 only in BASE, 0 only in NEW)" in text and "Warnings" not in text


def test_a_point_timed_under_a_throttle_says_so(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0}, seed=1, throttled=("a",))
    new = fake_run(tmp_path / "new", {"a": 10.0, "b": 24.0}, seed=2, throttled=("a", "b"))
    c = compare.compare(base, new)
    assert dict(zip(c.table["impl"], c.table["throttled"])) == {"a": "base+new", "b": "new"}
    text = compare.to_markdown(c, 0.05, 0.01)
    assert "a difference there may be the clock's" in text and text.splitlines()[-1].endswith("| new |")
    calm = compare.to_markdown(compare.compare(fake_run(tmp_path / "c", {"a": 10.0}), fake_run(tmp_path / "d", {"a": 9.0})),
                               0.05, 0.01)
    assert "throttled" not in calm


def test_a_correct_implementation_that_starts_failing_is_a_regression(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0})
    new = fake_run(tmp_path / "new", {"a": 10.0}, status={"a": "fail"})
    c = compare.compare(base, new)
    assert list(c.table["verdict"]) == ["regression"] and c.regressions == 1


def test_refuses_different_gpus_unless_told(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0})
    new = fake_run(tmp_path / "new", {"a": 10.0}, gpu="NVIDIA H100")
    with pytest.raises(compare.CompareError, match="H200.*H100.*--allow-different-gpus"):
        compare.compare(base, new)
    c = compare.compare(base, new, allow_different_gpus=True)
    assert c.table["verdict"].tolist() == ["same"]
    assert any("H200" in w and "H100" in w for w in c.warnings)  # allowed, but said


def test_points_only_in_one_run_are_counted(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0, "c": 30.0})
    new = fake_run(tmp_path / "new", {"a": 10.0, "d": 5.0})
    c = compare.compare(base, new)
    assert (c.joined, c.only_base, c.only_new) == (1, 2, 1)
    assert "1 points joined (2 only in BASE, 1 only in NEW)" in compare.to_markdown(c, 0.05, 0.01)


def noisy_run(folder, medians: dict, spread: float, seed=0):
    """A run whose kernel samples spread +-``spread`` around each median (IQR / median about ``spread``)."""
    rng = random.Random(seed)
    store = RunStore.create(folder, {"gpu": "NVIDIA H200", "scenario": "synthetic"}, "synthetic")
    for impl, median in medians.items():
        samples = [median * (1 + rng.uniform(-spread, spread)) for _ in range(40)]
        store.append({"case_id": "c1", "case": "verify c1", "impl": impl, "backend": "fa2", "status": "pass",
                      "median_us": sorted(samples)[20], "samples": {"kernel": samples}})
    store.finalize()
    store.close()
    return folder


@pytest.mark.slow
def test_two_cpu_runs_of_one_scenario_show_no_regression(cpu_run, tmp_path):
    again = tmp_path / "again"
    r = invoke("run", cpu_run / run_folder.SCENARIO, "--out", again, "--device", "cpu")
    assert r.exit_code == 0, r.output
    c = compare.compare(cpu_run, again)
    assert c.regressions == 0, c.table  # a quicker second run (warm caches) may show as an improvement: no exit 1
    r = invoke("compare", cpu_run, again)
    assert r.exit_code == 0 and "too noisy to judge when either run's noise is above 0.05" in r.output


def test_a_change_inside_the_points_noise_is_the_same_and_beyond_it_a_regression(tmp_path):
    # noise about 0.04 in both runs: sqrt(2) * 0.04 ~ 0.057 > the 5% threshold, under 20%
    base = noisy_run(tmp_path / "base", {"a": 10.0, "b": 10.0}, spread=0.04, seed=1)
    new = noisy_run(tmp_path / "new", {"a": 10.3, "b": 12.0}, spread=0.04, seed=2)
    c = compare.compare(base, new)
    row = c.table.set_index("impl")
    assert row.loc["a", "verdict"] == "same" and row.loc["b", "verdict"] == "regression", c.table
    assert 0.03 < row.loc["a", "noise_base"] < 0.05  # from the samples: fake runs record no noise column
    assert invoke("compare", base, new).exit_code == 1


def test_a_noisy_point_is_too_noisy_never_a_regression(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0}, seed=1)
    new = noisy_run(tmp_path / "new", {"a": 15.0, "b": 20.0}, spread=0.3, seed=2)
    c = compare.compare(base, new)
    assert set(c.table["verdict"]) == {"too noisy"} and c.regressions == 0
    r = invoke("compare", base, new)
    assert r.exit_code == 0 and "| too noisy |" in r.output and "2 too noisy" in r.output
    # a threshold above the noise judges them again
    assert dict(zip(*compare.compare(base, new, threshold=0.4).table[["impl", "verdict"]].values.T)) == \
        {"a": "regression", "b": "same"}


# ------------------------------------------------------------------ options

@pytest.mark.parametrize("threshold, alpha, match", [
    (-1, 0.01, r"--threshold must be >= 0 \(a relative change, 0.05 = 5%\), got -1"),
    (float("nan"), 0.01, "--threshold must be a finite number >= 0.*got nan"),
    (float("inf"), 0.01, "--threshold must be a finite number >= 0.*got inf"),
    ("five", 0.01, "--threshold must be a number"),
    (0.05, 5, "--alpha must be between 0 and 1.*got 5"),
    (0.05, 0, "--alpha must be between 0 and 1.*got 0"),
    (0.05, 1, "--alpha must be between 0 and 1.*got 1"),
    (0.05, -0.1, "--alpha must be between 0 and 1.*got -0.1"),
    (0.05, float("nan"), "--alpha must be between 0 and 1.*got nan"),
])
def test_validate_refuses_options_out_of_range(threshold, alpha, match):
    with pytest.raises(compare.CompareError, match=match):
        compare.validate(threshold, alpha)


def test_validate_accepts_the_edges_inside_the_range(tmp_path):
    for threshold, alpha in [(0, 0.5), (0.05, 0.01), (2.0, 0.999)]:
        compare.validate(threshold, alpha)
    run = fake_run(tmp_path / "run", {"a": 10.0})
    with pytest.raises(compare.CompareError, match="--threshold"):  # compare() checks too
        compare.compare(run, run, threshold=-1)


# ------------------------------------------------------------------ warnings

def test_different_scenarios_are_a_warning(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0}, scenario="one")
    new = fake_run(tmp_path / "new", {"a": 10.0}, scenario="two")
    c = compare.compare(base, new)
    assert c.joined == 1 and len(c.warnings) == 1
    assert "different scenarios" in c.warnings[0] and "'one'" in c.warnings[0] and "'two'" in c.warnings[0]
    assert "different scenarios" in compare.to_markdown(c, 0.05, 0.01)
    same = fake_run(tmp_path / "same", {"a": 10.0}, scenario="one", seed=3)
    assert compare.compare(base, same).warnings == []


def test_a_run_that_timed_nothing_is_a_warning(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0})
    check = fake_run(tmp_path / "check", {"a": None, "b": None}, status={"b": "fail"})
    c = compare.compare(base, check)
    assert [w for w in c.warnings if w.startswith("NEW timed nothing")]
    assert dict(zip(c.table["impl"], c.table["verdict"])) == {"a": "same", "b": "regression"}


# ------------------------------------------------------------------ an interrupted run, made by the CLI

SMALL = textwrap.dedent("""
    name = "small"
    implementations = ["torch-trim", "torch-mask"]
    [fixed]
    num_qo_heads = 4
    num_kv_heads = 2
    head_dim = 64
    dtype = "bfloat16"
    batch_size = 2
    [[sweep]]
    mode = ["verify"]
    draft_tokens = 4
    prefix_len = 40
    window_left = [3, 15]
    storage = ["paged", "ragged"]
    """)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A finished CPU run of SMALL (4 cases x 2 implementations), made once for this module."""
    folder = tmp_path_factory.mktemp("cpu")
    scenario = folder / "small.toml"
    scenario.write_text(SMALL)
    r = invoke("run", scenario, "--out", folder / "run", "--device", "cpu")
    assert r.exit_code == 0, r.output
    return folder / "run"


def interrupt(run, out, keep: int):
    """A copy of ``run`` as an interrupted sweep leaves it: the first ``keep`` rows in the journal,
    no results.csv / samples.csv, meta.json state "interrupted"."""
    shutil.copytree(run, out)
    (out / run_folder.TABLE).unlink()
    (out / run_folder.SAMPLES).unlink()
    lines = (out / run_folder.ROWS).read_text().splitlines(keepends=True)
    (out / run_folder.ROWS).write_text("".join(lines[:keep]) + lines[keep][:20])  # and a half-written line
    meta = json.loads((out / run_folder.META).read_text())
    (out / run_folder.META).write_text(json.dumps({**meta, "state": "interrupted"}))
    return out


def test_an_interrupted_run_compares_with_a_warning(cpu_run, tmp_path):
    total = len(run_folder.read_rows(cpu_run))
    assert total == 8
    partial = interrupt(cpu_run, tmp_path / "partial", keep=5)
    c = compare.compare(cpu_run, partial)
    assert (c.joined, c.only_base, c.only_new) == (5, 3, 0)
    assert len(c.warnings) == 1
    assert re.fullmatch(r"NEW is not a complete run \(interrupted: 5 (of 8 )?points\)", c.warnings[0])
    text = compare.to_markdown(c, 0.05, 0.01)
    assert "5 points joined (3 only in BASE, 0 only in NEW)" in text and c.warnings[0] in text
    assert c.table.loc[c.table["verdict"] != "only in one run", "p"].notna().all()  # samples from the journal
    # The other way round, against a published folder (results.csv and samples.csv, no journal).
    published = shutil.copytree(cpu_run, tmp_path / "published")
    (published / run_folder.ROWS).unlink()
    c = compare.compare(partial, published)
    assert (c.joined, c.only_base, c.only_new) == (5, 0, 3)
    assert len(c.warnings) == 1 and c.warnings[0].startswith("BASE is not a complete run (interrupted: 5 ")
    assert c.table.loc[c.table["verdict"] != "only in one run", "p"].notna().all()


def test_a_run_with_no_points_is_refused(cpu_run, tmp_path):
    empty = interrupt(cpu_run, tmp_path / "empty", keep=0)
    with pytest.raises(compare.CompareError, match=r"NEW .*empty has no points \(state: interrupted\)"):
        compare.compare(cpu_run, empty)


def test_no_point_in_common_is_refused(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0}, case_id="c1")
    new = fake_run(tmp_path / "new", {"a": 10.0}, case_id="c2")
    with pytest.raises(compare.CompareError, match="no point in common"):
        compare.compare(base, new)


# ------------------------------------------------------------------ garbage in

@pytest.fixture
def good(tmp_path):
    return fake_run(tmp_path / "good", {"a": 10.0, "b": 20.0})


def published_copy(run, out):
    """``run`` as a published folder: results.csv and samples.csv, no journal."""
    shutil.copytree(run, out)
    (out / run_folder.ROWS).unlink()
    return out


def test_a_folder_that_is_not_a_run_is_refused(good, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("hello")
    with pytest.raises(compare.CompareError, match=r"NEW .*notes is not a swabench run folder \(no meta.json\)"):
        compare.compare(good, tmp_path / "notes")
    with pytest.raises(compare.CompareError, match=r"BASE .*README.md is not a swabench run folder"):
        compare.compare(tmp_path / "notes" / "README.md", good)
    (tmp_path / "meta-only").mkdir()
    (tmp_path / "meta-only" / run_folder.META).write_text("{}")
    with pytest.raises(compare.CompareError, match="has no results.csv and no rows.jsonl"):
        compare.compare(good, tmp_path / "meta-only")


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (b"\xff\xfe\x00garbage", "not UTF-8 text"),
])
def test_garbage_meta_json_is_refused(good, tmp_path, text, match):
    bad = shutil.copytree(good, tmp_path / "bad")
    path = bad / run_folder.META
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(compare.CompareError, match=rf"^NEW .*bad.*meta\.json.*{match}"):
        compare.compare(good, bad)


@pytest.mark.parametrize("name, drop, match", [
    (run_folder.TABLE, "status", r"results\.csv.* no column status"),
    (run_folder.TABLE, "case_id", r"results\.csv.* no column case_id"),
    (run_folder.TABLE, "impl", r"results\.csv.* no column impl"),
    (run_folder.SAMPLES, "value_us", r"samples\.csv.* no column value_us"),
    (run_folder.SAMPLES, "backend", r"samples\.csv.* no column backend"),
])
def test_a_csv_missing_columns_is_refused(good, tmp_path, name, drop, match):
    import pandas as pd
    bad = published_copy(good, tmp_path / "bad")
    pd.read_csv(bad / name).drop(columns=[drop]).to_csv(bad / name, index=False)
    with pytest.raises(compare.CompareError, match=f"^BASE .*bad.*{match}"):
        compare.compare(bad, good)


@pytest.mark.parametrize("name, text, match", [
    (run_folder.TABLE, "", r"results\.csv (is unreadable|cannot be read).*EmptyDataError"),
    (run_folder.SAMPLES, "", r"samples\.csv(\.gz)? (is unreadable|cannot be read).*EmptyDataError"),
    (run_folder.TABLE, 'case_id,impl,backend,status\nc1,a,fa2,pass\n"c2,b',
     r"results\.csv (is unreadable|cannot be read)"),
])
def test_a_damaged_csv_is_refused(good, tmp_path, name, text, match):
    bad = published_copy(good, tmp_path / "bad")
    (bad / name).write_text(text)
    with pytest.raises(compare.CompareError, match=f"^NEW .*bad.*{match}"):
        compare.compare(good, bad)


def test_a_published_folder_without_samples_is_refused(good, tmp_path):
    bad = published_copy(good, tmp_path / "bad")
    (bad / run_folder.SAMPLES).unlink()
    with pytest.raises(compare.CompareError, match="has results.csv but no samples.csv"):
        compare.compare(good, bad)


def test_a_damaged_journal_is_refused(good, tmp_path):
    bad = shutil.copytree(good, tmp_path / "bad")
    with open(bad / run_folder.ROWS, "a") as f:
        f.write(json.dumps({"impl": "x", "backend": "fa2"}) + "\n")  # a row without its case_id
    with pytest.raises(compare.CompareError, match=r"^NEW .*bad.*rows\.jsonl.*damaged"):
        compare.compare(good, bad)


# ------------------------------------------------------------------ start-up

def test_importing_compare_does_not_import_matplotlib():
    code = ("import sys, swabench.analysis.compare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_cli_exits_2_on_a_compare_error_and_1_on_a_regression(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0}, seed=1)
    new = fake_run(tmp_path / "new", {"a": 10.0, "b": 24.0}, seed=2)
    (tmp_path / "notes").mkdir()
    r = invoke("compare", base, tmp_path / "notes")
    assert r.exit_code == 2 and "is not a swabench run folder" in r.output
    r = invoke("compare", base, new, "--threshold", "-1")
    assert r.exit_code == 2 and "--threshold must be >= 0" in r.output
    assert invoke("compare", base, new).exit_code == 1
    same = invoke("compare", base, tmp_path / "." / "base")
    assert same.exit_code == 2 and "are the same run folder: give each run folder once" in same.output



def test_a_folder_whose_copies_disagree_is_refused(good, tmp_path):
    bad = shutil.copytree(good, tmp_path / "bad")
    table = (bad / run_folder.TABLE).read_text()
    (bad / run_folder.TABLE).write_text(table.replace(",pass,", ",fail,", 1))
    r = invoke("compare", good, bad)
    assert r.exit_code == 2 and "rows.jsonl and results.csv disagree" in r.output and str(bad) in r.output
    published = published_copy(good, tmp_path / "published")
    (published / "results.csv.gz").write_bytes(run_folder.gzipped(table.replace(",pass,", ",fail,", 1)))
    with pytest.raises(compare.CompareError, match=r"has both results\.csv and results\.csv\.gz and they differ"):
        compare.compare(good, published)
