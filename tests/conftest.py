import pytest
import torch


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: this checks behaviour without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
