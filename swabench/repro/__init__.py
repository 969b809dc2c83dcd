"""Standalone reproducer scripts (docs/repro.md).  ``command`` and the names of the committed scripts stay here,
free of the tracing stack, for the pages and the console that print them."""

import shlex


def command(source: str, case_id: str, impl: str, backend: str) -> str:
    """The ``swabench repro`` command for one point (what a failed point's line prints)."""
    return "swabench repro " + shlex.join([source, "--case", case_id, "--impl", impl, "--backend", backend])


def script_stem(ref: str) -> str:
    """The name a bug's committed script and its logs go by under repro/: 'flashinfer#4972' -> 'flashinfer-4972'."""
    return ref.replace("#", "-")


def ref_of(stem: str) -> str:
    """The bug a committed script under repro/ is for: 'flashinfer-4972' -> 'flashinfer#4972'."""
    return stem.replace("flashinfer-", "flashinfer#")


def committed(folder) -> dict:
    """The reproducers committed under ``folder`` (the checkout's repro/), by the bug each is for: the refs a script
    that runs them may be given."""
    from pathlib import Path

    return {ref_of(p.stem): p for p in sorted(Path(folder).glob("*.py"))}


def unknown_ref(refs, folder) -> str | None:
    """What to tell a script given a REF no reproducer under ``folder`` is for (the first such), or None."""
    from swabench.errors import did_you_mean

    known = committed(folder)
    unknown = next((ref for ref in refs if ref not in known), None)
    if unknown is None:
        return None
    return f"REF {unknown!r}: no script under repro/ is for it{did_you_mean(unknown, known)}; the committed ones: " \
           f"{', '.join(known)}"
