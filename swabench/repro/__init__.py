"""Standalone reproducer scripts (docs/repro.md).  ``command`` stays here, free of the tracing stack, for
the pages and the console that print it beside a failed point."""

import shlex


def command(source: str, case_id: str, impl: str, backend: str) -> str:
    """The ``swabench repro`` command for one point (what a failed point's line prints)."""
    return "swabench repro " + shlex.join([source, "--case", case_id, "--impl", impl, "--backend", backend])
