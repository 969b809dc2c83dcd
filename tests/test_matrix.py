"""The release matrix: one scenario on several releases, side by side (statuses, declared upstream
bugs, time against the newest release), and the command's refusals."""

import json
import random
from pathlib import Path

import pandas as pd
import pytest
from conftest import invoke, pages_text

from swabench.analysis import matrix
from swabench.store.run_folder import RunStore


def release_run(folder, release, points, scenario="release", gpu="NVIDIA H200", seed=0):
    """A run folder made on ``release``; ``points`` maps (impl, kind, status, upstream) to a median (None:
    untimed), on one case; samples drawn around the median with 1% jitter."""
    rng = random.Random(seed)
    store = RunStore.create(folder, {"gpu": gpu, "scenario": scenario, "libraries": {"flashinfer": release}},
                            scenario)
    for (impl, kind, status, bug), median in points.items():
        row = {"case_id": "c1", "case": "decode c1", "mode": "decode", "storage": "paged", "batch_size": 4,
               "prefix_len": 300, "window_left": 127, "impl": impl, "kind": kind, "library": "flashinfer",
               "backend": "fa2", "status": status, "upstream": bug, "reason": "known bug caught" * (status == "xfail")}
        if median is not None:
            samples = [median * (1 + rng.uniform(-0.01, 0.01)) for _ in range(40)]
            row.update(median_us=sorted(samples)[20], samples={"kernel": samples})
        store.append(row)
    store.finalize(state="complete")
    return folder



def base_and_fixed(tmp_path, base_points, fixed_points, patch=None, scenario="release", names=("base", "fixed")):
    """Two release_run folders under ``tmp_path`` (``names``): on 0.7.4 and on 0.7.4+flashinfer-4992, its meta.json
    recording ``patch`` (FIX by default) as ``swabench run --patch`` does."""
    base = release_run(tmp_path / names[0], "0.7.4", base_points, scenario=scenario, seed=1)
    fixed = release_run(tmp_path / names[1], "0.7.4+flashinfer-4992", fixed_points, scenario=scenario, seed=2)
    meta = json.loads((fixed / "meta.json").read_text())
    (fixed / "meta.json").write_text(json.dumps({**meta, "patch": patch or FIX}))
    return base, fixed

SINK_BUG = "flashinfer#sink-uri"  # a ref no declaration has: the matrix still lists what the rows recorded


def three_releases(tmp_path):
    old = release_run(tmp_path / "old", "0.6.1", {("window", "correct", "pass", None): 30.0,
                                                  ("sink", "correct", "xfail", SINK_BUG): None,
                                                  ("bug", "known-bug", "xfail", None): None}, seed=1)
    mid = release_run(tmp_path / "mid", "0.7.2.post1", {("window", "correct", "pass", None): 20.4,
                                                        ("sink", "correct", "xfail", SINK_BUG): None,
                                                        ("bug", "known-bug", "xfail", None): None}, seed=2)
    new = release_run(tmp_path / "new", "0.7.4", {("window", "correct", "pass", None): 20.0,
                                                  ("sink", "correct", "pass", SINK_BUG): 15.0,
                                                  ("bug", "known-bug", "xfail", None): None}, seed=3)
    return [new, old, mid]  # in no order: the matrix orders by release


def test_the_matrix_orders_releases_and_says_statuses_bugs_and_times(tmp_path):
    m = matrix.build(three_releases(tmp_path))
    assert [r.version for r in m.releases] == ["0.6.1", "0.7.2.post1", "0.7.4"] and m.newest.version == "0.7.4"
    statuses = m.statuses.set_index("impl")
    assert statuses.loc["sink", "0.7.2.post1"] == "1 xfail" and statuses.loc["sink", "0.7.4"] == "1 pass"
    bugs = m.bugs.set_index("upstream").loc[SINK_BUG]
    assert bugs["0.6.1"] == "has it (1/1 points)" and bugs["0.7.4"] == "not shown (1 points pass)"
    t = m.timings.set_index("release")
    assert t.loc["0.6.1", "verdict"] == "slower" and abs(t.loc["0.6.1", "ratio"] - 1.5) < 0.03
    assert t.loc["0.7.2.post1", "verdict"] == "same"  # 2%: under the threshold
    assert set(m.timings["impl"]) == {"window"}  # sink is timed on 0.7.4 alone


def test_matrix_writes_markdown_csv_and_figure(tmp_path):
    out = tmp_path / "matrix"
    r = invoke("matrix", *three_releases(tmp_path), "--out", out, "--unbuilt", "0.6.0=no wheel for Python 3.12")
    assert r.exit_code == 0, r.output
    text = (out / "MATRIX.md").read_text()
    assert text.startswith("# Release matrix: release on flashinfer 0.6.1, 0.7.2.post1, 0.7.4")
    assert "| 0.6.0 |  | not built | 0 | no: no wheel for Python 3.12 |" in text
    assert f"| {SINK_BUG} |" in text and "has it (1/1 points)" in text
    assert "| 0.6.1 | 1 | 1.50 (1.50-1.50) | 1 | 0 | 0 | 0 |" in text  # slower, with the newest as 1
    points = pd.read_csv(out / "matrix.csv")
    assert len(points) == 9 and set(points["release"].astype(str)) == {"0.6.1", "0.7.2.post1", "0.7.4"}
    window = points[(points["impl"] == "window")].set_index("release")
    assert window.loc["0.6.1", "verdict"] == "slower" and window.loc["0.7.4", "ratio_to_newest"] != \
        window.loc["0.7.4", "ratio_to_newest"]  # the newest is the reference: no ratio of its own
    assert (out / "matrix.png").stat().st_size > 10_000


@pytest.mark.parametrize("change,message", [
    ({"scenario": "other"}, "the folders ran different scenarios"),
    ({"release": "0.7.4"}, "both ran flashinfer 0.7.4: one folder per release"),
    ({"release": None}, "recorded no flashinfer release"),
])
def test_folders_that_make_no_matrix_exit_2(tmp_path, change, message):
    a = release_run(tmp_path / "a", "0.7.4", {("window", "correct", "pass", None): 20.0})
    b = release_run(tmp_path / "b", change.get("release", "0.7.2.post1"), {("window", "correct", "pass", None): 20.0},
                    scenario=change.get("scenario", "release"))
    r = invoke("matrix", a, b, "--out", tmp_path / "m")
    assert r.exit_code == 2 and message in r.output and not (tmp_path / "m").exists()


def test_one_folder_and_a_bad_unbuilt_exit_2(tmp_path):
    a = release_run(tmp_path / "a", "0.7.4", {("window", "correct", "pass", None): 20.0})
    assert "give two run folders or more" in invoke("matrix", a, "--out", tmp_path / "m").output
    r = invoke("matrix", a, a, "--unbuilt", "0.6.0", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "--unbuilt: give RELEASE=WHY" in r.output


def test_matrix_refuses_an_unbuilt_release_that_ran_a_library_not_under_test_and_a_repeat(tmp_path):
    a = release_run(tmp_path / "a", "0.7.4", {("window", "correct", "pass", None): 20.0})
    b = release_run(tmp_path / "b", "0.7.2.post1", {("window", "correct", "pass", None): 20.0})
    r = invoke("matrix", a, b, "--unbuilt", "0.7.4=no wheel", "--out", tmp_path / "m")
    assert r.exit_code == 2 and f"--unbuilt 0.7.4: {a} ran flashinfer 0.7.4" in r.output
    r = invoke("matrix", a, b, "--unbuilt", "0.6.0=x", "--unbuilt", "0.6.0=y", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "--unbuilt: 0.6.0 is given twice" in r.output
    r = invoke("matrix", a, b, "--library", "torch", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "--library torch: not a library under test" in r.output and "allowed: flashinfer" in r.output
    r = invoke("matrix", a, b, tmp_path / "a" / ".." / "a", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "are the same run folder" in r.output
    assert not (tmp_path / "m").exists()


def test_the_findings_page_says_which_release_has_which_bug(tmp_path):
    from swabench.publish import findings

    page = pages_text(findings.write(three_releases(tmp_path), tmp_path / "FINDINGS.md"))
    section = page.split("## Across releases")[1].split("\n## ")[0]
    assert f"- `{SINK_BUG}` ((not declared in this swabench)): shown on 0.6.1, 0.7.2.post1; not shown on 0.7.4." \
        in section
    assert "- 0.6.1 against 0.7.4: median time ratio 1.50 over 1 timed points; 1 slower, 0 faster" in section
    assert "| sink | correct | 1 xfail | 1 xfail | 1 pass |" in section


def test_older_releases_show_only_where_releases_are_compared(tmp_path):
    from swabench.publish import findings

    folders = three_releases(tmp_path)
    page = pages_text(findings.write(folders, tmp_path / "FINDINGS.md"))
    answers = page.split("## Answers")[1].split("\n## ")[0]
    assert "**Which FlashInfer release**" in answers and "`flashinfer#sink-uri` shows on 0.6.1, 0.7.2.post1" in answers
    assert "slower and faster: kernel time against the newest release's" in answers
    assert "0.7.2.post1 the same on 1/1 points" in answers and "0.6.1 slower on 1/1 points (1.50x)" in answers
    elsewhere = [part for part in page.split("\n## ")[1:]  # how a page was made names every run folder
                 if part.split("\n")[0] not in ("Answers", "Runs", "Across releases", "Measurement quality",
                                                 "How this page was made")]
    assert str(tmp_path / "new") in "".join(elsewhere)
    assert not any(str(tmp_path / old) in part for part in elsewhere for old in ("old", "mid"))



def test_a_patched_build_is_shown_beside_its_base_and_never_read_as_the_newest_release(tmp_path):
    from swabench.publish import findings, sections

    base, fixed = base_and_fixed(tmp_path, {("window", "correct", "xfail", SINK_BUG): 20.0},
                                 {("window", "correct", "pass", SINK_BUG): 20.0})
    runs = findings.load([base, fixed])
    assert [r.folder for r in sections.older_releases(runs)] == [str(fixed)]
    page = pages_text(findings.write([base, fixed], tmp_path / "FINDINGS.md"))
    section = page.split("## Across releases")[1].split("\n## ")[0]
    assert f"- Patched: 0.7.4+flashinfer-4992 against 0.7.4: {SINK_BUG}: 1 of 1 wrong points right;" in section
    assert "- 0.7.4+flashinfer-4992 against 0.7.4: median time ratio 1.00 over 1 timed points" in section
    answer = next(line for line in page.split("\n## Answers")[1].splitlines() if line.startswith("- `release` on"))
    assert answer.startswith(f"- `release` on 0.7.4 to 0.7.4+flashinfer-4992: `{SINK_BUG}` shows on 0.7.4; the patch: "
                             f"{SINK_BUG}: 1 of 1 wrong points right; nothing else of 1 points changed")

PUBLISHED = sorted((Path(__file__).resolve().parent / "fixtures" / "published" / "results").glob(
    "h200-release-[0-9]*"))  # frozen copies of the published runs (tests/fixtures/make_published.py)


@pytest.mark.slow
def test_the_release_matrix_published_from_the_h200():
    """The committed runs of release.toml on four FlashInfer releases, read as frozen fixtures."""
    m = matrix.build(PUBLISHED)
    assert [r.version for r in m.releases] == ["0.6.18.post1", "0.7.0.post1", "0.7.2.post1", "0.7.4"]
    sink = m.bugs.set_index("upstream").loc["flashinfer#1679"]
    assert [str(sink[v]).split(" (")[0] for v in ("0.6.18.post1", "0.7.0.post1", "0.7.2.post1", "0.7.4")] == \
        ["has it", "has it", "has it", "not shown"]
    statuses = m.statuses.set_index("impl")
    for impl, row in statuses.iterrows():
        for v in ("0.6.18.post1", "0.7.0.post1", "0.7.2.post1", "0.7.4"):
            assert "fail" not in row[v].replace("xfail", "") and "xpass" not in row[v], (impl, v, row[v])
            if row["kind"] == "known-bug":
                assert "pass" not in row[v].replace("xfail", "") or "xpass" in row[v], (impl, v, row[v])
    t = m.timings
    assert (t[t["release"] == "0.7.2.post1"]["verdict"] == "same").all()
    slower = t[(t["release"] == "0.6.18.post1") & (t["verdict"] == "slower")]
    assert len(slower) and set(slower["backend"]) == {"fa2"} and (slower["ratio"] > 1.05).all()


def patched_run(folder, release, points, patch=None):
    """A run folder like ``release_run``'s with several cases: ``points`` maps (case, impl, kind, status, upstream)
    to nothing; ``patch``: the record ``swabench run --patch`` leaves (its base, name, ...)."""
    meta = {"gpu": "NVIDIA H200", "scenario": "noncausal", "libraries": {"flashinfer": release}}
    meta.update({"patch": patch} if patch else {})
    store = RunStore.create(folder, meta, "noncausal")
    for case, impl, kind, status, bug in points:
        store.append({"case_id": case, "case": f"extend {case}", "mode": "extend", "storage": "paged",
                      "batch_size": 1, "prefix_len": 300, "window_left": 333, "impl": impl, "kind": kind,
                      "library": "flashinfer", "backend": "fa2", "status": status, "upstream": bug,
                      "reason": ""})
    store.finalize(state="complete")
    return folder


FIX = {"name": "flashinfer-4992", "file": "patches/flashinfer-4992.diff", "sha256": "ab" * 32, "base": "0.7.4",
       "files": ["data/include/flashinfer/attention/scheduler.cuh"], "library": "flashinfer"}
BUG = "flashinfer#4972"


def base_and_patched(tmp_path, patched_statuses):
    base = [("c1", "paged-window", "correct", "xfail", BUG), ("c2", "paged-window", "correct", "xfail", BUG),
            ("c3", "paged-window", "correct", "pass", None), ("c1", "paged-plan", "known-bug", "xfail", None),
            ("c4", "paged-window", "correct", "skip", None)]
    patched = [(c, i, k, s, b) for (c, i, k, _, b), s in zip(base, patched_statuses)]
    return (patched_run(tmp_path / "base", "0.7.4", base),
            patched_run(tmp_path / "fixed", "0.7.4+flashinfer-4992", patched, FIX))


def test_a_patched_release_is_set_against_its_base_bug_by_bug(tmp_path):
    m = matrix.build(base_and_patched(tmp_path, ["pass", "pass", "pass", "xfail", "pass"]))
    assert [r.version for r in m.releases] == ["0.7.4", "0.7.4+flashinfer-4992"]
    (c,) = m.patched
    bugs = c.bugs.set_index("bug")
    assert bugs.loc[BUG, ["predicted", "wrong", "right", "verdict"]].tolist() == [2, 2, 2, "turns right"]
    assert bugs.loc["paged-plan", "verdict"] == "still wrong"  # the known bug's caught row is still caught
    assert set(c.changed["case_id"]) == {"c1", "c2"} and c.points == 4  # the skip on the base is left out
    assert c.line() == "0.7.4+flashinfer-4992 against 0.7.4: flashinfer#4972: 2 of 2 wrong points right; " \
                       "no other point of the 4 both ran changed status"  # a mistake still caught goes unsaid
    assert m.newest.version == "0.7.4"  # a patched build sorts after its base, but the releases are timed against it


def test_a_patched_release_is_timed_against_its_base(tmp_path):
    base, fixed = base_and_fixed(tmp_path, {("window", "correct", "pass", None): 20.0},
                                 {("window", "correct", "pass", None): 30.0})
    m = matrix.build([fixed, base])
    t = m.timings.set_index("release")
    assert list(t.index) == ["0.7.4+flashinfer-4992"] and m.newest.version == "0.7.4"
    patched = t.loc["0.7.4+flashinfer-4992"]
    assert patched["verdict"] == "slower" and abs(patched["ratio"] - 1.5) < 0.03


def test_a_patch_that_changes_other_points_says_so_in_the_matrix_report(tmp_path):
    base, fixed = base_and_patched(tmp_path, ["pass", "xfail", "fail", "xpass", "pass"])
    out = tmp_path / "m"
    r = invoke("matrix", base, fixed, "--out", out)
    assert r.exit_code == 0, r.output
    text = (out / "MATRIX.md").read_text()
    assert "### 0.7.4+flashinfer-4992 against 0.7.4" in text
    assert "**Verdict:** 0.7.4+flashinfer-4992 against 0.7.4: flashinfer#4972: 1 of 2 wrong points right; " \
           "paged-plan: 1 of 1 wrong points right; 1 other point of the 4 both ran changed status " \
           "(paged-window [fa2] on extend c3: pass to fail)." in text
    assert "| extend c3 | paged-window | fa2 | pass | fail |" in text  # the point it broke
    assert "partly right" in text


def test_a_patched_release_without_its_base_is_said_not_compared(tmp_path):
    other = patched_run(tmp_path / "old", "0.7.2", [("c1", "paged-window", "correct", "xfail", BUG)])
    _, fixed = base_and_patched(tmp_path, ["pass"] * 5)
    m = matrix.build([other, fixed])
    assert not m.patched and any("patches 0.7.4, which no folder here ran without a patch" in w for w in m.warnings)
