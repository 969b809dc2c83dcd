import os
import textwrap

import pytest
import torch

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
