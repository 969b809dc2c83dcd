"""The command line's shared parts: its options, the progress bar it draws a run on, how a command
finds and loads its scenario and prints a finished sweep, and the rule that turns every error a user
can fix into a plain message and exit status 2."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import click

from swabench.cli import streams
from swabench.errors import RunFailed, UserError
from swabench.inputs import scenarios
from swabench.run import isolation
from swabench.store import paths


class InputError(click.ClickException):
    exit_code = 2


class PathArg(click.Path):
    """A path argument or option that refuses an empty path (an unset shell variable, ``--out "$OUT"``, must not
    mean the working folder or the default) and one no file system holds (a name over 255 bytes)."""

    def convert(self, value, param, ctx):
        name = param.opts[0] if param is not None and param.param_type_name == "option" else \
            (param.human_readable_name if param is not None else "path")
        if isinstance(value, str) and not value:
            raise InputError(f"{name}: the path is empty (an unset shell variable?); give a path")
        if isinstance(value, str) and paths.too_long(value):
            raise InputError(f"{name}: {paths.too_long(value)}")
        return super().convert(value, param, ctx)


class Main(click.Group):
    """Library errors become plain messages: exit 2 for input a user can fix (a path the system finds too long
    among them, wherever it is read or written), 1 for work that failed; Ctrl-C anywhere is 130, as a shell expects;
    a standard stream that cannot be written ends its output, not the work (``streams``); a working folder that was
    deleted is refused before anything starts."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        streams.guard()
        if not standalone_mode:  # the caller takes the result and the exceptions
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            status = self._main(*args, **kwargs)
        except SystemExit as e:
            status = e.code
        sys.exit(streams.exit_status(status))

    def _main(self, *args, **kwargs):
        try:
            os.getcwd()
        except OSError as e:
            click.echo(f"Error: the working folder no longer exists (os.getcwd(): {e.strerror}); cd to a folder that "
                       f"exists and run the command again", err=True)
            return InputError.exit_code
        return super().main(*args, **kwargs)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise InputError(str(e)) from None
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
            path = os.fsdecode(e.filename or "")
            raise InputError(f"{path[:80]}{'...' * (len(path) > 80)}: "
                             f"{paths.too_long(path) or 'a name in this path is too long for the file system'}") \
                from None
        except RunFailed as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.secho("interrupted", fg="yellow", err=True)
            ctx.exit(130)


class Bar:
    """lifecycle.Progress on stderr: notes, and over the points a click progress bar on a terminal, or
    elsewhere (a log file, CI) a plain line every 5% of the points (``Lines``)."""

    def __init__(self):
        self.bar = None

    def note(self, text, warn=False):
        click.secho(text, fg="yellow" if warn else None, err=True)

    def start(self, total, label, unit="points"):
        if not getattr(sys.stderr, "isatty", lambda: False)():
            self.bar = Lines(total, label, unit)
            return
        self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True,
                                     item_show_func=lambda r: r and f"{r['impl']} {r['status']}")
        self.bar.__enter__()

    def advance(self, rows=1, row=None):
        self.bar.update(rows, row)

    def finish(self):
        if self.bar:
            self.bar.__exit__(None, None, None)
            self.bar = None


class Lines:
    """Progress without a terminal: "run: 120/2400 points (5%), 3 fail, 0 xpass, 35 s" each time
    another 5% of the points is done, and once at the end."""

    def __init__(self, total: int, label: str, unit: str = "points"):
        self.total, self.label, self.unit, self.done, self.shown = total, label, unit, 0, 0
        self.step = max(1, -(-total // 20))
        self.status: dict[str, int] = {}
        self.started = time.perf_counter()

    def update(self, rows: int, row: dict | None = None) -> None:
        self.done += rows
        if row:
            self.status[row.get("status")] = self.status.get(row.get("status"), 0) + 1
        if self.done // self.step > self.shown // self.step:
            self.show()

    def show(self) -> None:
        self.shown = self.done
        percent = f" ({100 * self.done // self.total}%)" if self.total else ""
        verdicts = f", {self.status.get('fail', 0)} fail, {self.status.get('xpass', 0)} xpass" if self.status else ""
        click.echo(f"{self.label}: {self.done}/{self.total} {self.unit}{percent}{verdicts}, "
                   f"{time.perf_counter() - self.started:.0f} s", err=True)

    def __exit__(self, *exc) -> None:
        if self.shown != self.done or not self.done:
            self.show()


def device_of(choice: str, what: str = "--device cuda"):
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{what}: no CUDA device is visible here (torch.cuda.is_available() is False)"
                         + ("; use --device cpu or auto" if what == "--device cuda" else ""))
    return torch.device(choice)


opt = click.option
device_option = opt("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                    help="Where to run; auto picks CUDA when it is there.")
strict_option = opt("--strict", is_flag=True, help="Also exit 1 when a known bug is not caught (xpass), e.g. in CI.")
l2_option = opt("--l2", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
                help="GPU timing: flush L2 before every call (flush not counted), or back-to-back calls.")
case_option = opt("--case", "cases", multiple=True, metavar="ID|TEXT",
                  help="Only cases whose id starts with, whose label contains, or whose [[sweep]] group "
                       "is, this (repeatable).")
costs_option = opt("--costs-from", "costs_from", type=PathArg(exists=True, file_okay=False), metavar="RUN_DIR",
                   help="Balance the shards by each point's time in this earlier run.")
model_option = opt("--model", metavar="NAME", help="Only this model preset's cases (see `swabench models`); without "
                                                   "SCENARIO, the shipped template for it (models.toml on a GPU, "
                                                   "models-cpu.toml without one).")
impl_option = opt("--impl", "impls", multiple=True, metavar="NAME", help="Only these implementations (repeatable).")
out_option = opt("--out", type=PathArg(file_okay=False), help="Run folder (default: runs/NAME-WHAT-DEVICE-TIME).")
run_dir = click.argument("run_dir", type=PathArg(exists=True, file_okay=False))


def run_options(command):
    """The options ``run`` and ``check`` share."""
    resume = opt("--resume", is_flag=True, help="Continue the run in --out, skipping the points it already has.")
    patch = opt("--patch", type=PathArg(exists=True, dir_okay=False), metavar="FILE.diff",
                help="Run a patched release: this unified diff to the installed FlashInfer's JIT sources (paths from "
                     "its package folder), applied to a copy with a JIT cache of its own; recorded as BASE+NAME.")
    for option in (patch, *isolation_options, strict_option, resume, model_option, case_option, impl_option,
                   device_option, out_option):
        command = option(command)
    return command


isolation_options = (
    opt("--retry-crashed", is_flag=True,
        help="With --resume: run again the points recorded as crash (a resume leaves them out otherwise)."),
    opt("--point-timeout", type=click.FloatRange(1, 86400), default=isolation.POINT_LIMIT_S, show_default=True,
        metavar="SECONDS", help="A point whose worker answers nothing for this long is hung: killed, recorded as "
                                "crash, and the sweep goes on."),
    opt("--in-process", is_flag=True,
        help="Run the points in this process instead of a supervised worker: a crash then ends the run (what the "
             "profilers use; SWABENCH_IN_PROCESS=1 makes it the default)."),
)


def scenario_file(name: str | None, device_type: str) -> Path:
    default = "default" if device_type == "cuda" else "cpu"
    if name is None:
        click.echo(f"no scenario given: running {default}.toml" + " (the embedded CPU default: no GPU here)"
                   * (default == "cpu"), err=True)
    return scenarios.find(name or default)


def model_scenario(scenario, model, device_type: str) -> str | None:
    """--model NAME without SCENARIO: the shipped template for this device (models.toml on a GPU,
    models-cpu.toml without one); the name is checked here, before any work."""
    if not model:
        return scenario
    from swabench.inputs import models
    try:
        models.get(model)
    except ValueError as e:
        raise InputError(f"--model: {e}") from None
    return scenario or ("models" if device_type == "cuda" else "models-cpu")


def load(name, impls=(), cases=(), device_type="cpu", model=None) -> scenarios.Scenario:
    path = name if isinstance(name, Path) else scenario_file(name, device_type)
    s = scenarios.load(path, impl_filter=impls or None)
    return scenarios.select(scenarios.select_model(s, model), cases)


def report_outcome(outcome, strict: bool, resume_with: str) -> None:
    summary(outcome.table, outcome.folder)
    for text, colour in outcome.messages(strict, resume_with):
        click.secho(text, fg=colour, err=True)
    sys.exit(outcome.exit_status(strict))


def summary(table, out: Path) -> None:
    from swabench.publish.markdown import console_summary

    colours = {"  FAIL": "red", "  CRASH": "red", "  XPASS": "yellow"}
    click.echo(f"\nresults: {out}" if len(table) else "no rows")
    for line in console_summary(table, folder=str(out)).splitlines():
        click.secho(line, fg=next((c for k, c in colours.items() if line.startswith(k)), None))
