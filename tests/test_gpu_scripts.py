"""The GPU node's shell scripts (scripts/gpu-split.sh, gpu-join.sh, gpu-bundle.sh, h200.sh): a wheel in parts joins
back to its files byte for byte; a wrong argument, manifest or RECORD is a message and exit 2 before anything is
removed, never a traceback or a wait on the terminal; a folder a file names is removed only where it is a plain name
inside the stage; a bundle rebuilt where downloads fail keeps the old one."""

import hashlib
import io
import lzma
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import wheel_of

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("xz", "split", "sha256sum", "tar")),
                                reason="needs xz, split, sha256sum and tar")


def run(script: str, *args, **kwargs) -> subprocess.CompletedProcess:
    kwargs = {"stdin": subprocess.DEVNULL, "timeout": 120, **kwargs}
    return subprocess.run(["bash", SCRIPTS / script, *map(str, args)], capture_output=True, text=True, **kwargs)


def files_of(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist()}


def stage_parts(stage: Path, name: str, files: dict[str, bytes]) -> None:
    """STAGE/parts holding ``files`` as gpu-split.sh writes a wheel's: an xz'd tar in one part, and its manifest."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    part = lzma.compress(tar_bytes.getvalue())
    (stage / "parts").mkdir(parents=True, exist_ok=True)
    (stage / "parts" / f"{name}.tar.xz.part00").write_bytes(part)
    (stage / "parts" / f"{name}.manifest").write_text(f"{name} {hashlib.sha256(part).hexdigest()} 1\n")


def test_a_wheel_in_parts_joins_back_to_its_files_whatever_transfers_bring_them(tmp_path):
    """gpu-split.sh writes the wheel's files as xz'd tar parts of at most PART_BYTES and a manifest; gpu-join.sh waits
    for every part (a transfer may bring only some), then unpacks each file byte for byte as the wheel's RECORD
    says, and refuses parts that do not join."""
    files = {"big/__init__.py": b"", "big/lib.so": os.urandom(300_000) + bytes(200_000),
             "big-1.0.dist-info/METADATA": b"Name: big\nVersion: 1.0\n"}
    wheel = wheel_of(tmp_path / "big-1.0-py3-none-any.whl", files)
    subprocess.run(["bash", SCRIPTS / "gpu-split.sh", wheel, tmp_path / "parts", "100000"], check=True)
    parts = sorted((tmp_path / "parts").glob("*.part*"))
    assert len(parts) >= 3 and all(p.stat().st_size <= 100_000 for p in parts)
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == sorted([p.name for p in parts] +
                                                                            [f"{wheel.name}.manifest"])
    stage = tmp_path / "stage"
    (stage / "parts").mkdir(parents=True)
    shutil.copy(tmp_path / "parts" / f"{wheel.name}.manifest", stage / "parts")
    unpacked = stage / "unpacked" / wheel.name
    for i, part in enumerate(parts):  # one transfer a part
        shutil.copy(part, stage / "parts")
        r = run("gpu-join.sh", stage, check=True)
        if i < len(parts) - 1:
            assert f"{i + 1} of {len(parts)} parts staged" in r.stderr and not unpacked.exists()
    with zipfile.ZipFile(wheel) as z:
        assert all((unpacked / name).read_bytes() == z.read(name) for name in z.namelist())
    assert (unpacked / ".joined").exists()
    shutil.rmtree(unpacked)
    (stage / "parts" / parts[1].name).write_bytes((stage / "parts" / parts[0].name).read_bytes())  # a wrong part
    r = run("gpu-join.sh", stage)
    assert r.returncode == 1 and "do not join" in r.stderr and not unpacked.exists()


def test_a_larger_xz_dictionary_joins_the_same_and_a_wrong_one_is_refused_first(tmp_path):
    """XZ_DICT (a large library's parts) changes only how the stream is packed: gpu-join.sh puts the same files
    back; a value that is not a size in MiB is refused, exit 2, before any part is written."""
    files = {"big/lib.so": os.urandom(200_000) * 2, "big-1.0.dist-info/METADATA": b"Name: big\nVersion: 1.0\n"}
    wheel = wheel_of(tmp_path / "big-1.0-py3-none-any.whl", files)
    env = {**os.environ, "XZ_DICT": "nope"}
    r = subprocess.run(["bash", SCRIPTS / "gpu-split.sh", wheel, tmp_path / "parts"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "XZ_DICT nope" in r.stderr and not (tmp_path / "parts").exists()
    r = subprocess.run(["bash", SCRIPTS / "gpu-split.sh", wheel, tmp_path / "parts"], capture_output=True, text=True,
                       env={**env, "XZ_DICT": "2048MiB"})  # past xz's largest dictionary
    assert r.returncode == 2 and "from 1 to 1536" in r.stderr and not (tmp_path / "parts").exists()
    env["XZ_DICT"] = "8MiB"
    subprocess.run(["bash", SCRIPTS / "gpu-split.sh", wheel, tmp_path / "parts"], env=env, check=True)
    stage = tmp_path / "stage"
    shutil.copytree(tmp_path / "parts", stage / "parts")
    run("gpu-join.sh", stage, check=True)
    unpacked = stage / "unpacked" / wheel.name
    with zipfile.ZipFile(wheel) as z:
        assert all((unpacked / name).read_bytes() == z.read(name) for name in z.namelist())


def test_a_file_that_differs_from_the_wheels_record_is_refused(tmp_path):
    """By gpu-split.sh before it writes a part (exit 2, the old parts kept), and by gpu-join.sh in parts made of it
    all the same (exit 1: they do not join to the wheel)."""
    wheel = wheel_of(tmp_path / "big-1.0-py3-none-any.whl", {"big/lib.so": b"right"})
    lying = tmp_path / "lying" / wheel.name
    lying.parent.mkdir()
    files = {**files_of(wheel), "big/lib.so": b"wrong"}  # the same RECORD over other bytes
    with zipfile.ZipFile(lying, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)
    subprocess.run(["bash", SCRIPTS / "gpu-split.sh", wheel, tmp_path / "parts"], check=True)
    before = {p.name: p.read_bytes() for p in (tmp_path / "parts").iterdir()}
    r = run("gpu-split.sh", lying, tmp_path / "parts")
    assert r.returncode == 2 and "big/lib.so: sha256 differs from the wheel's RECORD" in r.stderr
    assert f"WHEEL {lying}" in r.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "parts").iterdir()} == before
    stage_parts(tmp_path / "stage", wheel.name, files)
    r = run("gpu-join.sh", tmp_path / "stage")
    assert r.returncode == 1 and "do not join" in r.stderr
    assert not (tmp_path / "stage" / "unpacked" / wheel.name).exists()


def joined_stage(tmp_path: Path) -> Path:
    """A stage holding one wheel already joined, and a folder beside it that is nobody's to remove."""
    stage = tmp_path / "stage"
    wheel = wheel_of(tmp_path / "good-1.0-py3-none-any.whl", {"good/__init__.py": b"x"})
    stage_parts(stage, wheel.name, files_of(wheel))
    run("gpu-join.sh", stage, check=True)
    assert (stage / "unpacked" / wheel.name / ".joined").exists()
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep").write_text("mine")
    (tmp_path / "victim.tar.xz.part00").write_bytes(b"a part, where ../../victim's would lie")
    return stage


@pytest.mark.parametrize("manifest", ["../../victim " + "0" * 64 + " 1\n", "\n", "", " " + "0" * 64 + " 1\n",
                                      "other.whl " + "0" * 64 + " 1\n", "evil.whl " + "0" * 64 + " 1 extra\n"])
def test_join_removes_nothing_a_manifest_names_outside_the_stage(tmp_path, manifest):
    """A manifest's NAME must be the file it is called after, a plain name ending in .whl: a path (../../victim)
    would have its folder removed, an empty name every joined wheel's."""
    stage = joined_stage(tmp_path)
    (stage / "parts" / "evil.whl.manifest").write_text(manifest)
    r = run("gpu-join.sh", stage)
    assert r.returncode == 2 and "evil.whl.manifest" in r.stderr, r.stderr
    assert (tmp_path / "victim" / "keep").read_text() == "mine"
    assert (stage / "unpacked" / "good-1.0-py3-none-any.whl" / ".joined").exists()


@pytest.mark.parametrize("count", ["0", "-1", "x", "101", ""])
def test_a_manifest_of_no_parts_is_refused_without_reading_the_terminal(tmp_path, count):
    """PARTS must be 1 to 100 (two-digit part names): with 0 the join read its standard input, so `source setup.sh`
    in a terminal waited for Ctrl-D."""
    stage = tmp_path / "stage"
    (stage / "parts").mkdir(parents=True)
    (stage / "parts" / "big.whl.manifest").write_text(f"big.whl {'0' * 64} {count}\n")
    terminal, typist = os.pipe()  # a terminal nobody types into
    try:
        r = run("gpu-join.sh", stage, stdin=terminal, timeout=30)
    finally:
        os.close(terminal)
        os.close(typist)
    assert r.returncode == 2 and f"PARTS '{count}' is not a count of 1 to 100" in r.stderr


@pytest.mark.parametrize("args, named", [((), "usage"), (("a", "b"), "usage"), (("FILE",), "STAGE")])
def test_join_refuses_a_wrong_argument(tmp_path, args, named):
    (tmp_path / "FILE").write_text("not a folder")
    r = run("gpu-join.sh", *[tmp_path / a if a == "FILE" else a for a in args])
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr


def bad_records(info: str) -> dict[str, tuple[str, str]]:
    """A RECORD's bad lines (or a missing RECORD), and what the refusal names."""
    return {"two fields": (f"{info}/RECORD", "a,b\n"),
            "outside": (f"{info}/RECORD", "../../etc/passwd,sha256=abc,1\n"),
            "absolute": (f"{info}/RECORD", "/etc/passwd,sha256=abc,1\n"),
            "no algorithm": (f"{info}/RECORD", "bad/__init__.py,abc,1\n"),
            "unknown algorithm": (f"{info}/RECORD", "bad/__init__.py,md9=abc,1\n"),
            "not UTF-8": (f"{info}/RECORD", "\udcff"),
            "none": (f"{info}/RECORD.old", "")}


@pytest.mark.parametrize("kind", list(bad_records("x")))
def test_a_record_that_cannot_be_read_is_refused(tmp_path, kind):
    """By gpu-split.sh (the old parts kept) and by gpu-join.sh (nothing left unpacked): a message naming the RECORD's
    line, exit 2, never a traceback."""
    wheel = wheel_of(tmp_path / "bad-1.0-py3-none-any.whl", {"bad/__init__.py": b"x"})
    info = "bad-1.0.dist-info"
    name, text = bad_records(info)[kind]
    files = {n: d for n, d in files_of(wheel).items() if n != f"{info}/RECORD"}
    files[name] = text.encode("utf-8", "surrogateescape")
    with zipfile.ZipFile(wheel, "w") as out:
        for member, data in files.items():
            out.writestr(member, data)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / f"{wheel.name}.manifest").write_text("the old parts' manifest")
    r = run("gpu-split.sh", wheel, tmp_path / "parts")
    assert r.returncode == 2 and "RECORD" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "parts" / f"{wheel.name}.manifest").read_text() == "the old parts' manifest"
    stage = tmp_path / "stage"
    stage_parts(stage, wheel.name, files)
    r = run("gpu-join.sh", stage)
    assert r.returncode == 2 and "RECORD" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (stage / "unpacked" / wheel.name).exists()


def wheel_arguments(tmp_path: Path) -> dict[str, tuple[list, str]]:
    """gpu-split.sh's wrong arguments, each with the argument its refusal names."""
    good = wheel_of(tmp_path / "good-1.0-py3-none-any.whl", {"good/__init__.py": b"x"})
    (tmp_path / "folder.whl").mkdir()
    (tmp_path / "text.whl").write_text("not a zip")
    os.mkfifo(tmp_path / "fifo.whl")
    (tmp_path / "file").write_text("")
    return {"missing": ([tmp_path / "missing.whl"], "WHEEL"), "folder": ([tmp_path / "folder.whl"], "WHEEL"),
            "not a zip": ([tmp_path / "text.whl"], "WHEEL"), "FIFO": ([tmp_path / "fifo.whl"], "WHEEL"),
            "PART_BYTES 0": ([good, "0"], "PART_BYTES"), "PART_BYTES x": ([good, "30M"], "PART_BYTES"),
            "DEST a file": ([good], "DEST")}


@pytest.mark.parametrize("kind", ["missing", "folder", "not a zip", "FIFO", "PART_BYTES 0", "PART_BYTES x",
                                  "DEST a file"])
def test_split_refuses_a_wrong_argument_before_it_touches_the_old_parts(tmp_path, kind):
    args, named = wheel_arguments(tmp_path)[kind]
    wheel, *size = args
    dest = tmp_path / ("file" if kind == "DEST a file" else "parts")
    if kind != "DEST a file":
        dest.mkdir()
        for old in (f"{wheel.name}.manifest", f"{wheel.name}.tar.xz.part00"):
            (dest / old).write_text("an old part")
    try:
        r = run("gpu-split.sh", wheel, dest, *size, timeout=30)
    finally:
        if kind == "FIFO":  # a reader the old script left waiting on the FIFO: give it its end of file
            try:
                os.close(os.open(tmp_path / "fifo.whl", os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    assert r.returncode == 2 and f"{named} " in r.stderr and "Traceback" not in r.stderr, r.stderr
    if kind != "DEST a file":
        assert sorted(p.read_text() for p in dest.iterdir()) == ["an old part"] * 2


def old_bundle(dest: Path) -> dict[str, bytes]:
    """A working bundle as an earlier gpu-bundle.sh left it (every file's bytes, by path)."""
    for path, data in {"whl/nvtx-0.1-py3-none-any.whl": b"old", "whl-fa4/fa4-0.1-py3-none-any.whl": b"old",
                       "parts/libs.whl.manifest": b"old", "deb/libdw1.deb": b"old", "jitcache.tar.xz": b"old",
                       "flashinfer.tar.xz": b"old", "setup.sh": b"old", "join.sh": b"old"}.items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(data)
    return {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}


def offline_env(tmp_path: Path, find_links: Path | None = None) -> dict:
    """pip with no index (and ``find_links`` as its only source), apt-get that fetches nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    python = Path(shutil.which("python3") or "/usr/bin/python3").parent
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    env.update(PATH=f"{bin_dir}:{python}:{os.environ['PATH']}", PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return {**env, "PIP_FIND_LINKS": str(find_links)} if find_links else env


def test_a_rebuild_that_cannot_download_keeps_the_working_bundle(tmp_path):
    dest = tmp_path / ".gpu"
    before = old_bundle(dest)
    r = run("gpu-bundle.sh", "0.7.4", dest, env={**offline_env(tmp_path), "FA4": "1", "CUDNN": "1"})
    assert r.returncode != 0
    assert {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    assert not list(dest.glob(".bundle.*"))


@pytest.mark.slow
def test_a_rebuild_replaces_the_old_bundle_once_everything_is_downloaded(tmp_path):
    """The new wheels, FlashInfer and scripts replace the old; another build's wheels, parts and JIT cache go; the
    .deb files apt could not fetch again stay."""
    index = tmp_path / "index"
    index.mkdir()
    wheels = ("apache_tvm_ffi-0.1.11", "nvtx-0.2.10", "pyelftools-0.31", "cupti_python-13.0.0")
    for name in wheels:
        wheel_of(index / f"{name}-py3-none-any.whl", {f"{name.split('-')[0]}/__init__.py": b""})
    wheel_of(index / "flashinfer_python-0.7.4-py3-none-any.whl",
             {"flashinfer/__init__.py": b"", "flashinfer/data/csrc/xqa/a.cu": b"kept",
              "flashinfer/data/csrc/moe/b.cu": b"dropped"})
    dest = tmp_path / ".gpu"
    old_bundle(dest)
    r = run("gpu-bundle.sh", "0.7.4", dest, env=offline_env(tmp_path, index))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (dest / "whl").iterdir()) == sorted(f"{n}-py3-none-any.whl" for n in wheels)
    assert sorted(p.name for p in dest.iterdir()) == ["deb", "flashinfer.tar.xz", "join.sh", "setup.sh", "whl"]
    assert (dest / "deb" / "libdw1.deb").read_bytes() == b"old"
    assert (dest / "join.sh").read_bytes() == (SCRIPTS / "gpu-join.sh").read_bytes()
    with tarfile.open(dest / "flashinfer.tar.xz") as tar:
        names = tar.getnames()
    assert "./flashinfer/data/csrc/xqa/a.cu" in names and "./flashinfer/data/csrc/moe/b.cu" not in names


@pytest.mark.parametrize("args, named", [(("--help",), "RELEASE"), (("0.7.4", "FILE"), "DEST"),
                                         (("0.7.4", "a", "b"), "usage")])
def test_bundle_refuses_a_wrong_argument(tmp_path, args, named):
    (tmp_path / "FILE").write_text("")
    r = run("gpu-bundle.sh", *[tmp_path / a if a == "FILE" else a for a in args], env=offline_env(tmp_path),
            cwd=tmp_path)
    assert r.returncode == 2 and named in r.stderr
    assert not (tmp_path / ".gpu").exists()


def test_h200_refuses_an_unknown_step_before_any_runs(tmp_path):
    r = run("h200.sh", tmp_path / "out", "nope", cwd=ROOT)
    assert r.returncode == 2 and "unknown step 'nope'" in r.stderr and "quick-compare" in r.stderr
    assert not (tmp_path / "out").exists()
    assert run("h200.sh").returncode == 2
    (tmp_path / "file").write_text("")
    r = run("h200.sh", tmp_path / "file", "quick")
    assert r.returncode == 2 and "OUTDIR" in r.stderr


def test_h200_lists_every_step_it_runs():
    import re

    text = (SCRIPTS / "h200.sh").read_text()
    listed = set(re.search(r"STEPS=\(([^)]*)\)", text).group(1).split())
    arms = {name for arm in re.findall(r"^    ([a-z0-9|-]+)\)", text, re.M) for name in arm.split("|")}
    assert listed == arms
