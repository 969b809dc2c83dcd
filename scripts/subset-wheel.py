"""Write a wheel holding a few files of another wheel: a prebuilt library an engine's wheel ships (FA3's), without
the engine.  Its distribution is NAME at the source's version; each kept file goes in as the source wheel holds it,
each --empty path as an empty module (a package's ``__init__.py`` whose real one imports the whole engine), and
--build's text beside the first kept file as SWABENCH_BUILD (what the files are and the torch they were built for,
which ``swabench env`` reports).  Its RECORD lists every file with its hash, as gpu-split.sh and gpu-join.sh check.

    python3 scripts/subset-wheel.py SOURCE.whl OUT_DIR --name NAME --keep PATH... [--empty PATH...] --build TEXT

Prints the new wheel's path.  Exit 2: a wrong argument (a path the source does not hold, a name that is not a
distribution's)."""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

BUILD_FILE = "SWABENCH_BUILD"


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--keep", action="append", required=True)
    parser.add_argument("--empty", action="append", default=[])
    parser.add_argument("--build", required=True)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", args.name):
        parser.error(f"--name {args.name!r}: not a distribution's name (letters, digits, '.', '_', '-')")
    if not args.source.is_file():
        parser.error(f"SOURCE {args.source}: not a file")
    try:
        source = zipfile.ZipFile(args.source)
    except (zipfile.BadZipFile, OSError) as e:
        parser.error(f"SOURCE {args.source}: not a wheel ({e})")
    held = set(source.namelist())
    missing = [p for p in args.keep if p not in held]
    if missing:
        parser.error(f"--keep {', '.join(missing)}: not in {args.source.name}")
    version = args.source.name.split("-")[1]
    dist = re.sub(r"[-.]+", "_", args.name)
    info = f"{dist}-{version}.dist-info"
    files = {p: source.read(p) for p in args.keep}
    files.update({p: b"" for p in args.empty})
    files[str(Path(args.keep[0]).parent / BUILD_FILE)] = args.build.encode() + b"\n"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {args.name}\nVersion: {version}\n"
                                 f"Summary: {args.build} (files of {args.source.name})\n").encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: swabench subset-wheel\nRoot-Is-Purelib: false\n" \
                             b"Tag: py3-none-any\n"
    record = [record_line(p, data) for p, data in files.items()] + [f"{info}/RECORD,,"]
    args.out.mkdir(parents=True, exist_ok=True)
    wheel = args.out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as out:
        for path, data in files.items():
            out.writestr(path, data)
        out.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
