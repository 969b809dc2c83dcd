"""scripts/stub-jit-cache.sh: a JIT module's objects are emptied only where ninja would count the module as built
on the next node (its .ninja_log names the library and every object); elsewhere ninja would link again, and from
emptied objects that makes a library missing their symbols."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "stub-jit-cache.sh"


def module(root: Path, name: str, logged: list[str], objects_newer: bool = False) -> Path:
    folder = root / ".cache" / "flashinfer" / "0.7.4" / "90a" / "cached_ops" / name
    folder.mkdir(parents=True)
    for obj in ("a.cuda.o", "b.cuda.o"):
        (folder / obj).write_bytes(b"object code")
        os.utime(folder / obj, (2000, 3000 if objects_newer else 1000))
    (folder / f"{name}.so").write_bytes(b"library")
    os.utime(folder / f"{name}.so", (2000, 2000))
    (folder / ".ninja_log").write_text("# ninja log v7\n" + "".join(f"1\t2\t3\t/tmp/fiws/{name}/{out}\tabc\n"
                                                                   for out in logged))
    return folder


def test_only_modules_ninja_counts_as_built_are_emptied(tmp_path):
    built = module(tmp_path, "built", ["a.cuda.o", "b.cuda.o", "built.so"])
    raced = module(tmp_path, "raced", ["a.cuda.o", "b.cuda.o"])  # the library's link not logged
    half = module(tmp_path, "half", ["a.cuda.o", "half.so"])  # an object not logged
    newer = module(tmp_path, "newer", ["a.cuda.o", "b.cuda.o", "newer.so"], objects_newer=True)
    subprocess.run(["bash", str(SCRIPT), str(tmp_path)], check=True)
    assert [(built / o).read_bytes() for o in ("a.cuda.o", "b.cuda.o")] == [b"", b""]
    assert (built / "a.cuda.o").stat().st_mtime == 1000  # its date kept: ninja still counts it built
    for folder in (raced, half, newer):
        assert (folder / "a.cuda.o").read_bytes() == b"object code", folder.name
    assert (built / "built.so").read_bytes() == b"library"


def test_a_wrong_argument_is_a_message_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    for args, named in (([], "usage"), ([str(tmp_path / "missing")], "DIR"), ([str(tmp_path / "file")], "DIR"),
                        ([str(tmp_path), str(tmp_path)], "usage")):
        r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
        assert r.returncode == 2 and named in r.stderr, (args, r.stderr)
