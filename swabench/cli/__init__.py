"""The ``swabench`` command line: parse, call the library, print, exit.  The only package that prints.

One module per command group (``sweep``, ``spread``, ``read``, ``tools``, ``repro``, ``fib``); ``options`` holds what they
share, ``streams`` the standard streams.  Exit status: 0 done, 1 a correct implementation failed the gate (or a
regression in ``compare``, work that could not finish, output that could not be written), 2 bad input (nothing
written) or nothing could run (every point skips), 130 interrupted.  Modules
that import torch, pandas or matplotlib are imported inside the commands that use them, so ``--help`` answers at
once and ``run --gpus`` starts its workers before it imports torch."""

from __future__ import annotations

import click

from swabench import __version__
from swabench.cli import fib, read, repro, spread, sweep, tools
from swabench.cli.options import Main


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swabench")
def main():
    """Correctness-gated benchmarks of sliding-window attention on FlashInfer."""


for _module in (sweep, spread, read, tools, repro, fib):
    for _command in _module.COMMANDS:
        main.add_command(_command)
