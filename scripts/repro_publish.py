"""Every reproducer under repro/ written again, with the issue body beside each one that has one, quoting only
the runs of that very script.

    python3 scripts/repro_publish.py [REF ...]   (default: every script under repro/)

A run is a log under repro/GPU-RELEASE/ (h200-0.7.4, h100-0.7.4, ...: a device call's OUT/repro-RELEASE, copied
there with its verdicts.json): it counts where its row in that folder's verdicts.json recorded the digest of the
script's code as this command writes it, so a body never quotes an older form of its script as this one's output.
Bodies that quote the suite's own rows take them from MEASURED.  Then write the findings again: their repro page
reads the same folders.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = {"sglang-verify-tree": ["results/h200-tree-0.7.4"]}


def runs_of(script: Path, digest: str | None = None) -> list[Path]:
    """The logs of runs of the code ``digest`` names (default: ``script``'s as it is on disk), one per GPU and
    release folder that holds one."""
    from swabench.repro import issue, ref_of
    from swabench.store import reading

    digest, ref = digest or issue.script_digest(script.read_text()), ref_of(script.stem)
    ran = [v.parent / f"{script.stem}.log" for v in sorted(script.parent.glob("*/verdicts.json"))
           if any(isinstance(r, dict) and r.get("ref") == ref and r.get("script_digest") == digest
                  for r in reading.json_file(v, reading.META))]
    return [log for log in ran if log.exists()]


def command(script: Path, digest: str | None = None) -> list[str]:
    """The ``swabench repro`` call that writes ``script`` (and its body, where one is committed) again, quoting the
    runs of the code ``digest`` names (default: the script's on disk; ``written`` gives the code it will write)."""
    from swabench.repro import ref_of

    args = ["--bug", ref_of(script.stem), "--out", os.path.relpath(script, ROOT), "--force"]
    args += [arg for log in runs_of(script, digest) for arg in ("--observed", os.path.relpath(log, ROOT))]
    if script.with_suffix(".md").exists():
        args += ["--issue"] + [arg for run in MEASURED.get(script.stem, []) for arg in ("--measured", run)]
    return [sys.executable, "-m", "swabench", "repro", *args]


def written(script: Path) -> str:
    """The digest of the code ``swabench repro`` writes for ``script``'s bug now, which may differ from the committed
    script's: a run of the committed form is no run of the new one."""
    from swabench.repro import issue, make, ref_of

    return issue.script_digest(make.for_bug(ref_of(script.stem))[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("refs", nargs="*", metavar="REF", help="a bug whose script to write again (default: every "
                        "script under repro/)")
    args = parser.parse_args(argv)
    from swabench.errors import UserError
    from swabench.repro import committed, unknown_ref

    unknown = unknown_ref(args.refs, ROOT / "repro")
    if unknown:
        parser.error(unknown)
    known = committed(ROOT / "repro")
    for script in [known[ref] for ref in args.refs] or list(known.values()):
        try:
            call = command(script, written(script))
        except UserError as e:  # a verdicts.json that does not read as JSON
            parser.error(str(e))
        print(f"{script.stem}: {call.count('--observed')} run(s) of this script", flush=True)
        if subprocess.run(call, cwd=ROOT).returncode:
            return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
