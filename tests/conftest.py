import dataclasses
import functools
import os
from pathlib import Path
import textwrap

import pytest
import torch

# Points run in the test's own process, where its monkeypatches reach them; tests/test_isolation.py runs them in the
# supervised worker, as a command does by default
os.environ["SWABENCH_IN_PROCESS"] = "1"

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # one worker a core: torch's own threads would only contend with the other workers


# two modes, two storages, a planted mistake and a GPU-only path: the CLI tests' scenario
TINY = textwrap.dedent("""
    name = "tiny"
    description = "two modes, two storages"
    implementations = ["torch-trim", "torch-mask", "planted-wide", "paged-window"]
    [fixed]
    num_qo_heads = 4
    num_kv_heads = 2
    head_dim = 64
    dtype = "bfloat16"
    batch_size = 2
    [[sweep]]
    mode = ["verify", "draft_extend"]
    draft_tokens = 4
    prefix_len = 40
    window_left = [3, 15]
    storage = ["paged", "ragged"]
    """)


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: this checks behaviour without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


BRIEF_KERNEL_TIMER = dict(warmup=1, min_repeats=5, max_repeats=5, budget_s=0.0)
BRIEF_PLAN_TIMER = dict(warmup=1, min_repeats=3, max_repeats=3, budget_s=0.0)


@pytest.fixture(scope="session", autouse=True)
def brief_host_timing():
    """A run inside a test (or a module's fixture) times each CPU point over a few calls, not 0.2 s of them: every
    point is still planned, gated and timed, and no test reads how precise a CPU time is (the timer itself:
    test_timing.py).  Commands run in a process of their own keep the full timer."""
    from swabench.measure import timing
    from swabench.run import lifecycle, sweep

    options = lifecycle.sweep_options
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "PLAN_TIMER", timing.HostTimerOptions(**BRIEF_PLAN_TIMER))
        patch.setattr(lifecycle, "sweep_options", lambda *a, **kw: dataclasses.replace(
            options(*a, **kw), host_timer=timing.HostTimerOptions(**BRIEF_KERNEL_TIMER)))
        yield


@pytest.fixture(scope="session", autouse=True)
def idle_cpu_pace():
    """Estimates inside a test are made at the idle pace, not measured (a second or more on a busy machine, and
    different each time): tests/test_cpu_cost.py measures it.  Commands run in a process of their own measure it."""
    from swabench.run import cpu_cost

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_cost, "pace", lambda: cpu_cost.IDLE)
        yield


@functools.cache
def shipped(name: str):
    """A shipped scenario, loaded once a process for the tests that only read it (edges.toml expands to some
    ten thousand points in a second or two, and five test modules read it)."""
    from swabench.inputs import scenarios

    return scenarios.load(scenarios.find(name))


@pytest.fixture
def one_figure(monkeypatch):
    """Commands that draw every figure draw the first only: for tests whose subject is what a command reads
    or refuses, not its figures (tests/test_plots_report.py draws and checks them all)."""
    from swabench.publish import plots

    first = next(iter(plots.FIGURES))
    monkeypatch.setattr(plots, "FIGURES", {first: plots.FIGURES[first]})


def invoke(*args):
    """The CLI as a user types it (arguments stringified), exceptions not swallowed."""
    from click.testing import CliRunner

    from swabench import cli
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def write_scenario(tmp_path):
    """Write a scenario file into the test's folder and return its path."""
    def write(text: str, name: str = "tiny.toml"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


def pages_text(written) -> str:
    """The findings page and its topic pages (``findings.write``'s paths) as one text, the page first."""
    return "\n".join(Path(p).read_text() for p in written)


def standin_calls(impl: str, w, backend: str) -> list:
    """(class or None, method, args, kwargs) of every FlashInfer call ``impl`` makes building, planning and running
    on ``w``, against the repro stand-in (the CPU sees a path's exact arguments)."""
    from swabench.impls import registry
    from swabench.repro import standin

    calls = []
    with standin.installed(lambda obj, cls, method, args, kwargs: calls.append((cls, method, args, kwargs))):
        runner = registry.get(impl).make(w, backend)
        runner.plan()
        runner.run()
    return calls


@pytest.fixture(autouse=True)
def flashinfer_importability_asked_afresh():
    """Tests plant stand-in ``flashinfer`` modules; whether it imports is cached, so each test asks again, and a
    later test never meets a stand-in that an earlier one removed."""
    from swabench.impls import flashinfer_library

    flashinfer_library._import_error.cache_clear()
    yield
    flashinfer_library._import_error.cache_clear()


def wheel_of(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel holding ``files``, its metadata and a RECORD of their sha256, as pip and the build tools write one."""
    import base64
    import hashlib
    import zipfile

    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for n, data in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(n, data)
    return path


def bound(signature_of, args, kwargs) -> dict:
    """A call bound to a library's released signature, every default filled in (TypeError where the library
    refuses it)."""
    import inspect

    b = inspect.signature(signature_of).bind(*args, **kwargs)
    b.apply_defaults()
    return dict(b.arguments)


def table_rows(w, tables):
    """Each request's pages, in order, as a block table holds them (the whole table, not trimmed)."""
    for b in range(w.batch_size):
        first, last = int(w.kv_indptr_host[b]), int(w.kv_indptr_host[b + 1])
        assert tables[b, :last - first].tolist() == w.kv_indices_host[first:last].tolist()
