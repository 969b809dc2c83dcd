import json
import random

import pytest

from swabench import compare
from swabench.results import RunStore


def test_mann_whitney_matches_the_asymptotic_reference():
    # scipy.stats.mannwhitneyu(..., method="asymptotic") gives U=17, p=0.11134688653314041 and U=3.5, p=0.0047933...
    u, p = compare.mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert u == 17 and abs(p - 0.11134688653314041) < 1e-12
    u, p = compare.mann_whitney_u([1, 2, 2, 3, 3, 3, 4], [3, 4, 4, 5, 5, 6, 7, 7])
    assert u == 3.5 and abs(p - 0.004793348746185457) < 1e-12


def fake_run(folder, medians: dict, gpu="NVIDIA H200", status=None, seed=0):
    """A run folder whose kernel samples are drawn around the given medians (1% jitter)."""
    rng = random.Random(seed)
    store = RunStore.create(folder, {"gpu": gpu, "scenario": "synthetic"}, "synthetic")
    for impl, median in medians.items():
        samples = [median * (1 + rng.uniform(-0.01, 0.01)) for _ in range(40)]
        store.append({"case_id": "c1", "case": "verify c1", "impl": impl, "backend": "fa2",
                      "status": (status or {}).get(impl, "pass"), "median_us": sorted(samples)[20],
                      "samples": {"kernel": samples}})
    store.finalize()
    return folder


def test_verdicts_on_synthetic_samples(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}, seed=1)
    new = fake_run(tmp_path / "new", {"a": 10.0, "b": 24.0, "c": 21.0, "d": 40.4}, seed=2,
                   status={"d": "pass"})
    table, _, _ = compare.compare(base, new)
    verdicts = dict(zip(table["impl"], table["verdict"]))
    assert verdicts == {"a": "same", "b": "regression", "c": "improvement", "d": "same"}  # d: 1% is under 5%
    assert list(table["verdict"])[:2] == ["regression", "improvement"]  # listed first
    assert json.loads(compare.to_json(table))[0]["impl"] == "b"


def test_a_correct_implementation_that_starts_failing_is_a_regression(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0})
    new = fake_run(tmp_path / "new", {"a": 10.0}, status={"a": "fail"})
    table, _, _ = compare.compare(base, new)
    assert list(table["verdict"]) == ["regression"]


def test_refuses_different_gpus_unless_told(tmp_path):
    base = fake_run(tmp_path / "base", {"a": 10.0})
    new = fake_run(tmp_path / "new", {"a": 10.0}, gpu="NVIDIA H100")
    with pytest.raises(compare.CompareError, match="H200.*H100.*--allow-different-gpus"):
        compare.compare(base, new)
    assert compare.compare(base, new, allow_different_gpus=True)[0]["verdict"].tolist() == ["same"]
