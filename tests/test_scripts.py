"""The Python scripts in scripts/ given a wrong argument, or run where what they need is missing: a message naming
the argument and exit 2, before anything is written, never a traceback and never exit 0."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
FIXTURE = ROOT / "tests" / "fixtures" / "h200-run"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: this checks what happens without one")


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(capsys, call, *argv) -> str:
    """What ``call(argv)`` says refusing it: it must exit 2."""
    with pytest.raises(SystemExit) as exit_:
        call([str(a) for a in argv])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def run(name: str, *args, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``python scripts/NAME.py ARGS`` as a user runs it (``pythonpath`` first on the path: a stand-in module)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (pythonpath, ROOT) if p)}
    return subprocess.run([sys.executable, SCRIPTS / f"{name}.py", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)


def assert_refused(r: subprocess.CompletedProcess, named: str) -> None:
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture
def broken_flashinfer(tmp_path) -> Path:
    """A folder whose flashinfer fails on import, as an install without its CUDA libraries does."""
    (tmp_path / "standin" / "flashinfer").mkdir(parents=True)
    (tmp_path / "standin" / "flashinfer" / "__init__.py").write_text("raise ImportError('libcudart.so.13: missing')")
    return tmp_path / "standin"


def test_repro_publish_refuses_a_bug_without_a_committed_script(capsys):
    said = refused(capsys, script("repro_publish").main, "flashinfer#4972", "nope")
    assert "REF 'nope'" in said and "flashinfer#4972" in said


@pytest.mark.parametrize("argv, named", [(["--jobs", "0"], "--jobs"), (["--jobs", "x"], "--jobs"),
                                         (["FILE"], "OUT"), (["nope"], "REF 'nope'"),
                                         (["JUNK"], "verdicts.json")])
def test_repro_verdicts_refuses_a_wrong_argument(tmp_path, capsys, argv, named):
    (tmp_path / "file").write_text("")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "verdicts.json").write_text('{"not": "a list"}')
    out = {"FILE": [tmp_path / "file"], "JUNK": [tmp_path / "junk"]}.get(argv[0], [tmp_path / "out"])
    rest = argv[1:] if argv[0] in ("FILE", "JUNK") else argv
    assert named in refused(capsys, script("repro_verdicts").arguments, *out, *rest)
    assert not (tmp_path / "out").exists()


def test_repro_verdicts_without_flashinfer_says_so_before_writing(tmp_path, broken_flashinfer):
    r = run("repro_verdicts", tmp_path / "out", "flashinfer#4972", pythonpath=broken_flashinfer)
    assert_refused(r, "flashinfer does not import here")
    assert "libcudart" in r.stderr and not (tmp_path / "out").exists()
    assert_refused(run("repro_verdicts", tmp_path / "out", "--jobs", "0"), "--jobs")
    assert not (tmp_path / "out").exists()


def test_play_dump_refuses_a_wrong_argument(tmp_path, broken_flashinfer):
    (tmp_path / "file").write_text("")
    assert_refused(run("play_dump"), "OUT")
    assert_refused(run("play_dump", tmp_path / "out", "--bogus"), "--bogus")
    assert_refused(run("play_dump", tmp_path / "file"), "OUT")
    assert not (tmp_path / "out").exists()
    assert_refused(run("play_dump", tmp_path / "out", pythonpath=broken_flashinfer), "flashinfer")
    assert not (tmp_path / "out").exists()


def test_profile_against_refuses_what_is_not_a_profile_and_a_run(tmp_path):
    import pandas as pd

    profile = tmp_path / "profile"
    profile.mkdir()
    assert_refused(run("profile_against"), "PROFILE_FOLDER")
    assert_refused(run("profile_against", profile, FIXTURE), "nsys_stats.csv")
    table = pd.read_csv(FIXTURE / "results.csv", dtype=str).head(3)[["case_id", "impl", "backend"]]
    table.to_csv(profile / "nsys_stats.csv", index=False)
    assert_refused(run("profile_against", profile, FIXTURE), "nsys_period_us")
    table.assign(nsys_period_us=10.0, agreement=0.01).to_csv(profile / "nsys_stats.csv", index=False)
    assert_refused(run("profile_against", profile, tmp_path / "nope"), "nope")
    os.symlink(tmp_path / "elsewhere.csv", profile / "nsys_vs_unprofiled.csv")
    assert_refused(run("profile_against", profile, FIXTURE), "nsys_vs_unprofiled.csv")
    assert not (tmp_path / "elsewhere.csv").exists()
    (profile / "nsys_vs_unprofiled.csv").unlink()
    r = run("profile_against", profile, FIXTURE)
    assert r.returncode == 0, r.stderr
    held = pd.read_csv(profile / "nsys_vs_unprofiled.csv")
    assert len(held) == 3 and "graph_unprofiled_us" in held.columns


@pytest.mark.parametrize("name, args, named", [("ragged_sm_scale", ["extra"], "extra"),
                                               ("sink_head_dims", [], "HEAD_DIM"),
                                               ("sink_head_dims", ["sixty"], "HEAD_DIM"),
                                               ("sink_head_dims", ["64", "7"], "HEAD_DIM"),
                                               ("wrapper_modes", ["FOLDER"], "OUT.csv"),
                                               ("wrapper_modes", ["a.csv", "b.csv"], "b.csv")])
def test_the_gpu_checks_refuse_a_wrong_argument(tmp_path, name, args, named):
    assert_refused(run(name, *[tmp_path if a == "FOLDER" else a for a in args]), named)


@no_gpu
@pytest.mark.parametrize("name, args", [("ragged_sm_scale", []), ("sink_head_dims", ["64", "128"]),
                                        ("wrapper_modes", ["OUT"])])
def test_the_gpu_checks_say_they_need_a_gpu(tmp_path, name, args):
    assert_refused(run(name, *[tmp_path / "out.csv" if a == "OUT" else a for a in args]), "needs a CUDA device")
    assert not (tmp_path / "out.csv").exists()
