"""A patched release (swabench run --patch): the patch checked against the installed package and refused, naming the
file and the hunk, before any work; applied to a copy of its own that the run and its worker import, with a JIT cache
of its own; recorded in meta.json with the release named BASE+NAME.  Checked on a stand-in package shaped as
FlashInfer's wheel (its data/include headers, jit/env.py, a prebuilt module in data/aot)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import TINY

from swabench.run import patched_release as pr

REPO = Path(__file__).resolve().parents[1]
HEADER = "data/include/flashinfer/attention/scheduler.cuh"
SOURCE = "".join(f"  line {i};\n" for i in range(1, 21))


def fake_site(root: Path, version="0.7.4") -> Path:
    """A site folder holding a ``flashinfer`` package laid out as the wheel is, and its distribution record."""
    pkg = root / "flashinfer"
    for rel, text in {"__init__.py": f"__version__ = {version!r}\n", "version.py": f"__version__ = {version!r}\n",
                      "jit/__init__.py": "", "jit/env.py": "FLASHINFER_AOT_PROVIDERS = ('installed jit cache',)\n",
                      HEADER: SOURCE, "data/include/flashinfer/utils.cuh": "// utils\n",
                      "data/aot/m/m.so": "prebuilt"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    meta = root / f"flashinfer_python-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
    return root


def diff(name: str, old: str, new: str, at: int = 5, folder: Path = None, header: str = "Fixes: a bug\n") -> Path:
    """A unified diff of HEADER replacing line ``at``'s text ``old`` with ``new`` (three lines of context)."""
    lines = SOURCE.splitlines()
    ctx = lines[at - 4:at - 1], lines[at:at + 3]
    body = [f" {x}" for x in ctx[0]] + [f"-{old}", f"+{new}"] + [f" {x}" for x in ctx[1]]
    text = header + f"--- a/{HEADER}\n+++ b/{HEADER}\n@@ -{at - 3},7 +{at - 3},7 @@\n" + "\n".join(body) + "\n"
    path = folder / f"{name}.diff"
    path.write_text(text)
    return path


def cli(tmp_path, site, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "SWABENCH_PATCHED": str(tmp_path / "p"),
           "HOME": str(tmp_path), "SWABENCH_IN_PROCESS": "0"}
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    return subprocess.run([sys.executable, "-m", "swabench", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)


def test_a_patch_that_does_not_apply_exits_2_naming_the_file_and_the_hunk(tmp_path):
    site = fake_site(tmp_path / "site")
    bad = diff("stale", "  line 5 was;", "  line 5 fixed;", folder=tmp_path)  # its context is not the release's
    out = tmp_path / "run"
    done = cli(tmp_path, site, "run", "cpu", "--device", "cpu", "--patch", bad, "--out", out)
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert f"--patch {bad}: it does not apply to flashinfer 0.7.4" in said
    assert f"{HEADER}: hunk #1 (at line 2) does not match" in said and "nothing was built or run" in said
    assert not out.exists() and not (tmp_path / "p").exists()  # refused before any folder, copy or build


def test_the_git_applier_refuses_the_same_patch_where_patch_is_not_installed(tmp_path, monkeypatch):
    site = fake_site(tmp_path / "site")
    bad = pr.read(diff("stale", "  line 5 was;", "  line 5 fixed;", folder=tmp_path))
    which = shutil.which
    monkeypatch.setattr(pr.shutil, "which", lambda name: None if name == "patch" else which(name))
    with pytest.raises(pr.PatchError, match=f"{re.escape(HEADER)}: the hunk at line 2 does not match"):
        pr.check(bad, site / "flashinfer", "0.7.4")
    good = pr.read(diff("fix", "  line 5;", "  line 5 fixed;", folder=tmp_path))
    pr.check(good, site / "flashinfer", "0.7.4")  # applies: no error, nothing written
    assert (site / "flashinfer" / HEADER).read_text() == SOURCE


@pytest.mark.parametrize("name,text,message", [
    ("bad name", f"--- a/{HEADER}\n+++ b/{HEADER}\n", "name it NAME.diff"),
    ("prose", "no diff here\n", "not a unified diff"),
    ("escape", "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n", "must be relative to the flashinfer package"),
])
def test_a_file_that_is_no_usable_patch_is_refused_naming_it(tmp_path, name, text, message):
    path = tmp_path / f"{name}.diff"
    path.write_text(text)
    with pytest.raises(pr.PatchError, match=message):
        pr.read(path)


def test_a_patch_names_its_files_from_the_package_folder_with_or_without_a_b_prefixes(tmp_path):
    p1 = pr.read(diff("fix", "  line 5;", "  line 5 fixed;", folder=tmp_path))
    assert p1.files == (HEADER,) and p1.strip == 1 and p1.name == "fix" and len(p1.sha256) == 64
    plain = tmp_path / "plain.diff"
    plain.write_text(p1.text.replace("a/data", "data").replace("b/data", "data"))
    assert pr.read(plain).strip == 0 and pr.read(plain).files == (HEADER,)


def test_the_copy_patches_its_own_files_links_the_rest_and_loads_nothing_prebuilt(tmp_path):
    site = fake_site(tmp_path / "site")
    patch = pr.read(diff("fix", "  line 5;", "  line 5 fixed;", folder=tmp_path))
    source = pr.Installed(site / "flashinfer", "0.7.4")
    copy = pr.prepare(patch, source, tmp_path / "p")
    assert copy.folder.name == f"flashinfer-0.7.4+fix-{patch.sha256[:12]}"
    patched = copy.package / HEADER
    assert not patched.is_symlink() and "  line 5 fixed;" in patched.read_text()
    assert (site / "flashinfer" / HEADER).read_text() == SOURCE  # the installed release is untouched
    assert (copy.package / "data/include/flashinfer/utils.cuh").is_symlink()
    assert not (copy.package / "__init__.py").is_symlink()  # a module's __file__ resolves inside the copy
    assert not (copy.package / "data/aot").exists()
    assert "FLASHINFER_AOT_PROVIDERS = ()" in (copy.package / "jit/env.py").read_text()
    (copy.workspace / "kept").write_text("a built module")
    assert pr.prepare(patch, source, tmp_path / "p") == copy and (copy.workspace / "kept").exists()  # reused


def test_a_package_without_its_dist_info_names_the_release_its_build_meta_gives(tmp_path):
    """0.7's version.py reads _build_meta and holds only a fallback literal: the release is _build_meta's."""
    package = tmp_path / "flashinfer"
    package.mkdir()
    (package / "version.py").write_text('try:\n    from ._build_meta import __version__\nexcept ImportError:\n'
                                        '    __version__ = "0.0.0+unknown"\n')
    assert pr._version_file(package) == "unknown"
    (package / "_build_meta.py").write_text('__version__ = "0.7.4"\n')
    assert pr._version_file(package) == "0.7.4"


def test_two_runs_of_one_patch_at_once_share_one_copy(tmp_path):
    """The copy is built under a lock: a run that starts while another builds waits, then takes the finished copy."""
    import threading

    site = fake_site(tmp_path / "site")
    patch = pr.read(diff("fix", "  line 5;", "  line 5 fixed;", folder=tmp_path))
    source = pr.Installed(site / "flashinfer", "0.7.4")
    copies, errors = [], []

    def build():
        try:
            copies.append(pr.prepare(patch, source, tmp_path / "p"))
        except Exception as e:  # noqa: BLE001: the test reports whatever either build raised
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(copies) == 4 and len(set(copies)) == 1
    assert "  line 5 fixed;" in (copies[0].package / HEADER).read_text()


def test_a_patched_run_records_the_patch_and_runs_the_copy(tmp_path):
    site = fake_site(tmp_path / "site")
    patch = diff("flashinfer-fix", "  line 5;", "  line 5 fixed;", folder=tmp_path)
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(textwrap.dedent(TINY))
    out = tmp_path / "run"
    done = cli(tmp_path, site, "run", scenario, "--device", "cpu", "--impl", "torch-trim", "--case", "verify",
               "--patch", patch, "--out", out)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["libraries"]["flashinfer"] == "0.7.4+flashinfer-fix"
    record = meta["patch"]
    assert record["name"] == "flashinfer-fix" and record["base"] == "0.7.4" and record["files"] == [HEADER]
    assert record["sha256"] == pr.read(patch).sha256 and meta["selection"]["patch_sha256"] == record["sha256"]
    assert Path(record["package"]).is_relative_to(tmp_path / "p") and "  line 5 fixed;" in \
        (Path(record["package"]) / HEADER).read_text()
    again = cli(tmp_path, site, "run", scenario, "--device", "cpu", "--impl", "torch-trim", "--case", "verify",
                "--out", out, "--resume")  # the folder ran patched: resumed without the patch, it is refused
    assert again.returncode == 2 and "--patch" in again.stderr


def test_activate_puts_the_copy_first_for_this_process_and_the_worker(tmp_path):
    site = fake_site(tmp_path / "site")
    patch = diff("fix", "  line 5;", "  line 5 fixed;", folder=tmp_path)
    code = ("import json, os, sys; from swabench.run import patched_release as pr; r = pr.activate(sys.argv[1]); "
            "import flashinfer, flashinfer.jit.env as env; "
            "print(json.dumps([r['package'], flashinfer.__file__, os.environ['FLASHINFER_WORKSPACE_BASE'], "
            "os.environ['PYTHONPATH'], env.FLASHINFER_AOT_PROVIDERS]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "SWABENCH_PATCHED": str(tmp_path / "p")}
    done = subprocess.run([sys.executable, "-c", code, str(patch)], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    package, imported, workspace, path, providers = json.loads(done.stdout)
    assert Path(imported).parent == Path(package) and Path(package).is_relative_to(tmp_path / "p")
    assert workspace == str(Path(package).parents[1] / "workspace") and providers == []
    assert path.split(os.pathsep)[0] == str(Path(package).parent)  # what the worker's imports see first


def test_failures_name_each_file_and_hunk_as_patch_and_git_say_them():
    said = pr.failures("checking file data/x.cuh\nHunk #2 FAILED at 628.\nchecking file jit/y.py\n"
                       "Reversed (or previously applied) patch detected!  Skipping patch.\n")
    assert said == "data/x.cuh: hunk #2 (at line 628) does not match; jit/y.py: already applied (its hunks match " \
                   "the patched side)"
    assert pr.failures("error: patch failed: data/x.cuh:628\nerror: data/x.cuh: patch does not apply\n") == \
        "data/x.cuh: the hunk at line 628 does not match"


def test_the_label_names_the_patched_release_and_refuses_another_release():
    meta = {"libraries": {"flashinfer": "0.7.4", "fa4": None},
            "patch": {"name": "flashinfer-4992", "base": "0.7.4", "library": "flashinfer"}}
    assert pr.label(meta)["libraries"] == {"flashinfer": "0.7.4+flashinfer-4992", "fa4": None}
    assert pr.label({"libraries": {"flashinfer": "0.7.4"}}) == {"libraries": {"flashinfer": "0.7.4"}}
    with pytest.raises(pr.PatchError, match="runs flashinfer 0.7.2, not 0.7.4"):
        pr.label({**meta, "libraries": {"flashinfer": "0.7.2"}})


COMMITTED = sorted((REPO / "patches").glob("*.diff"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_each_committed_patch_says_what_it_fixes_and_how_it_is_gated(path):
    patch = pr.read(path)
    head = patch.text.split("\n--- ", 1)[0]
    assert re.search(r"^Fixes: \S+", head, re.M) and re.search(r"^Origin: ", head, re.M)
    gate = re.search(r"^Gate: (.+)$", head, re.M)[1]
    assert f"--patch patches/{path.name}" in gate and "swabench matrix" in gate
    assert patch.files and all(f.startswith(("data/include/flashinfer/", "jit/", "attention/")) for f in patch.files)


WHEEL = os.environ.get("SWABENCH_FLASHINFER_WHEEL", "/tmp/fi074/flashinfer_python-0.7.4-py3-none-any.whl")


@pytest.mark.slow
@pytest.mark.skipif(not Path(WHEEL).is_file(), reason="set SWABENCH_FLASHINFER_WHEEL to the flashinfer-python 0.7.4 "
                                                       "wheel (pip download flashinfer-python==0.7.4 --no-deps)")
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_each_committed_patch_applies_to_the_0_7_4_wheel(path, tmp_path):
    import zipfile

    patch = pr.read(path)
    with zipfile.ZipFile(WHEEL) as wheel:
        for f in patch.files:
            wheel.extract(f"flashinfer/{f}", tmp_path)
    pr.check(patch, tmp_path / "flashinfer", "0.7.4")


def test_an_issue_body_says_the_fix_and_the_gates_verdict_read_from_the_runs(tmp_path):
    from test_matrix import FIX, patched_run

    from swabench.repro import fixes

    folder = tmp_path / "patches"
    folder.mkdir()
    gate = "python3 -m swabench run noncausal --patch patches/flashinfer-4992.diff --out runs/x"
    path = diff("flashinfer-4992", "  line 5;", "  line 5 fixed;", folder=folder,
                header=f"Fixes: flashinfer#4972 (fa2 non-causal)\nGate: {gate}\n")
    root = tmp_path / "results"
    root.mkdir()
    (said,) = fixes.lines("flashinfer#4972", folder, root)
    assert said == f"**A fix:** `patches/flashinfer-4992.diff` (sha256 {pr.read(path).sha256[:12]}), not yet checked " \
                   f"on a GPU."  # in the library's terms: no command of this suite's for a maintainer to read
    assert fixes.lines("holistic-offset", folder, root) == []  # no patch fixes it
    points = [("c1", "paged-window", "correct", "xfail", "flashinfer#4972"), ("c2", "paged-trim", "correct", "pass", None)]
    base = patched_run(root / "h200-noncausal-0.7.4", "0.7.4", points)
    patched_run(root / "h200-noncausal-0.7.2", "0.7.2", points)  # another release: not the base
    fixed = patched_run(root / "h200-noncausal-0.7.4+flashinfer-4992", "0.7.4+flashinfer-4992",
                        [("c1", "paged-window", "correct", "pass", "flashinfer#4972"), points[1]],
                        {**FIX, "sha256": pr.read(path).sha256})
    (said,) = fixes.lines("flashinfer#4972", folder, root)
    assert said == (f"**A fix, checked on a GPU:** `patches/flashinfer-4992.diff` (sha256 "
                    f"{pr.read(path).sha256[:12]}). On noncausal, 0.7.4+flashinfer-4992 against 0.7.4: "
                    f"flashinfer#4972: 1 of 1 wrong points right; no other point of the 2 both ran changed status.")
    assert [(b, f) for _, b, f in fixes.gated(fixes.for_bug("flashinfer#4972", folder), root)] == [(base, fixed)]


def test_an_issue_body_names_each_other_point_the_patch_changed_and_its_time(tmp_path):
    from test_matrix import FIX, base_and_fixed, patched_run

    from swabench.repro import fixes

    folder = tmp_path / "patches"
    folder.mkdir()
    path = diff("flashinfer-4992", "  line 5;", "  line 5 fixed;", folder=folder,
                header="Fixes: flashinfer#4972 (fa2 non-causal)\nGate: python3 -m swabench run release\n")
    root = tmp_path / "results"
    points = [("c1", "paged-window", "correct", "xfail", "flashinfer#4972"),
              ("c2", "pod-window", "correct", "pass", None), ("c3", "paged-plan", "known-bug", "xfail", None)]
    patched_run(root / "base", "0.7.4", points)
    patched_run(root / "fixed", "0.7.4+flashinfer-4992",
                [("c1", "paged-window", "correct", "pass", "flashinfer#4972"),
                 ("c2", "pod-window", "correct", "fail", None), points[2]], {**FIX, "sha256": pr.read(path).sha256})
    (said,) = fixes.lines("flashinfer#4972", folder, root)
    assert said.endswith("On noncausal, 0.7.4+flashinfer-4992 against 0.7.4: flashinfer#4972: 1 of 1 wrong points "
                         "right; 1 other point of the 3 both ran changed status (pod-window [fa2] on extend c2: pass "
                         "to fail).")  # the known bug still caught is no change; no times, so no time said
    _, slow = base_and_fixed(root, {("window", "correct", "pass", None): 20.0},
                             {("window", "correct", "pass", None): 30.0}, {**FIX, "sha256": pr.read(path).sha256},
                             scenario="timed", names=("timed-base", "slow"))
    timed = [s for s, _, f in fixes.gated(fixes.for_bug("flashinfer#4972", folder), root, "flashinfer#4972")
             if f == slow]
    assert timed == ["On timed, 0.7.4+flashinfer-4992 against 0.7.4: flashinfer#4972's rows not met; no other point "
                     "of the 1 both ran changed status; of 1 timed points, 1 slower (up to 1.50x) and 0 faster on one "
                     "NVIDIA H200"]
