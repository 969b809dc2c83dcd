"""The repository stays small enough to clone: the shipped runs, figures and findings pages under a budget, no
big file; the published pages name no machine's paths, and the findings page stays short enough to read."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
PUBLISHED_BUDGET = 18 * MB  # results/, plots/, findings/ and FINDINGS.md together: the checkout (23 MB) and a
# 36 MiB part of a bundle must fit one 64 MiB transfer to the GPU node (docs/gpu-node.md)
PAGE_LIMIT, ANSWERS_LIMIT = 60_000, 10 * 1024  # bytes of FINDINGS.md (its decision table a row a model, step and
# card), and of its Answers (10 KiB)
FILE_LIMIT = 2 * MB


def tracked_sizes(*folders: str) -> dict[str, int]:
    """Bytes on disk of each file git tracks (under ``folders`` if given); files deleted but not yet
    committed are left out."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = subprocess.run(["git", "ls-files", "-z", "--", *folders], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode().strip()}")
    sizes = {}
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink():
            sizes[name] = os.path.getsize(path)
    return sizes


def largest(sizes: dict[str, int], n: int = 10) -> str:
    top = sorted(sizes.items(), key=lambda item: -item[1])[:n]
    return "\n".join(f"  {size / MB:7.2f} MB  {name}" for name, size in top)


def test_results_plots_and_findings_stay_under_their_budget():
    sizes = tracked_sizes("results", "plots", "findings", "FINDINGS.md")
    total = sum(sizes.values())
    assert total < PUBLISHED_BUDGET, (f"results/, plots/ and the findings pages hold {total / MB:.1f} MB in "
                                      f"{len(sizes)} tracked files (budget {PUBLISHED_BUDGET / MB:.0f} MB); the "
                                      f"largest:\n{largest(sizes)}")


def test_no_tracked_file_is_over_the_limit():
    sizes = tracked_sizes()
    assert sizes, "git lists no tracked file"
    big = {name: size for name, size in sizes.items() if size > FILE_LIMIT}
    assert not big, f"{len(big)} tracked files over {FILE_LIMIT / MB:.0f} MB:\n{largest(big, len(big))}"


ABSOLUTE_PATH = re.compile(r"(?<![\w.\-/~])/(?:[\w.\-]+/)+[\w.\-]*")  # /tmp/o/x, not TB/s, h64/8 or 2/3


def test_published_pages_name_no_machines_paths():
    pages = [ROOT / "FINDINGS.md", *sorted((ROOT / "findings").glob("*.md")), *sorted((ROOT / "plots").glob("*/*.md"))]
    found = {page.relative_to(ROOT).as_posix(): ABSOLUTE_PATH.findall(page.read_text()) for page in pages}
    assert len(pages) > 10 and not {page: hits for page, hits in found.items() if hits}
    assert ABSOLUTE_PATH.findall("`swabench run x --out /tmp/o/run` at 1.4 TB/s, h64/8, 2/3") == ["/tmp/o/run"]


def test_the_findings_page_is_short_and_links_every_topic_page():
    """FINDINGS.md keeps the decision table, the answers (at most 10 KiB), a link per topic and the runs; the topic
    pages it links are the ones in findings/, every link on every page resolves, and the README links the page
    alone."""
    page = (ROOT / "FINDINGS.md").read_text()
    answers = page.split("\n## Answers\n")[1].split("\n## ")[0]
    assert len(page.encode()) <= PAGE_LIMIT and len(answers.encode()) <= ANSWERS_LIMIT, \
        (len(page.encode()), len(answers.encode()))
    topics = sorted((ROOT / "findings").glob("*.md"))
    linked = set(re.findall(r"\]\((findings/[\w-]+\.md)\)", page.split("\n## Topics\n")[1].split("\n## ")[0]))
    assert linked == {p.relative_to(ROOT).as_posix() for p in topics} and len(topics) > 5
    assert set(re.findall(r"\]\((findings/[\w-]+\.md)\)", answers)) <= linked  # each answer links its topic
    for source in [ROOT / "FINDINGS.md", *topics]:
        for target in re.findall(r"\]\(([^)#]+)\)", source.read_text()):
            if "://" not in target:
                assert (source.parent / target).exists(), f"{source.name} links {target}, which does not exist"
    readme = (ROOT / "README.md").read_text()
    assert "](FINDINGS.md)" in readme and "findings/" not in re.sub(r"`[^`]*`", "", readme)


def test_every_helper_script_names_only_what_the_package_holds():
    """scripts/*.py run only on a GPU node; here each must compile, and every swabench name it imports and every
    attribute it reads of an imported swabench module must exist (a renamed helper would otherwise fail there)."""
    import ast
    import importlib
    import importlib.util
    import types

    for path in sorted((ROOT / "scripts").glob("*.py")):
        modules = {}
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("swabench"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    found = getattr(module, alias.name, None)
                    if found is None and importlib.util.find_spec(f"{node.module}.{alias.name}"):
                        found = importlib.import_module(f"{node.module}.{alias.name}")
                    assert found is not None, f"{path.name}: from {node.module} import {alias.name}"
                    if isinstance(found, types.ModuleType):
                        modules[alias.asname or alias.name] = found
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                assert hasattr(modules[node.value.id], node.attr), f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}"
