"""Several GPUs and nodes: shards are disjoint and complete, merging gives back the one-run table,
and the job-array launch path works through submitit's local executor."""

import json

import pandas as pd
import pytest
from conftest import cpu_only, invoke

from swabench.run import launch, shards
from swabench.store import run_folder
from swabench.inputs import scenarios

TINY = """
implementations = ["torch-trim", "torch-mask", "planted-wide"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
[[sweep]]
mode = ["verify", "decode"]
draft_tokens = 4
prefix_len = [40, 90]
window_left = [3, 15, 31]
"""
KEY = list(run_folder.KEY)


@pytest.fixture
def tiny(write_scenario):
    return write_scenario(TINY)


@pytest.fixture
def small(write_scenario):
    """Six cases: for the tests whose subject is the worker processes, each of which imports torch."""
    return write_scenario(TINY.replace("prefix_len = [40, 90]", "prefix_len = 40"), "small.toml")


def keys(folder):
    t = pd.read_csv(folder / run_folder.TABLE)
    return sorted(map(tuple, t[KEY].values)), t


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_are_disjoint_and_complete(tiny, count):
    full = scenarios.load(tiny)
    parts = [shards.shard(scenarios.load(tiny), i, count).points for i in range(count)]
    assert sorted(p.key for part in parts for p in part) == sorted(p.key for p in full.points)
    assert all(len({p.case for p in part} & {p.case for p in other}) == 0
               for a, part in enumerate(parts) for other in parts[a + 1:])
    assert [p.key for p in shards.shard(scenarios.load(tiny), 0, count).points] == [p.key for p in parts[0]]


@pytest.mark.parametrize("text", ["1/1", "3", "a/b", "-1/2"])
def test_bad_shard_spec(text):
    with pytest.raises(shards.ShardError, match="--shard"):
        shards.parse_shard(text)


def test_gpu_lists():
    assert launch.parse_gpus("all", 4) == [0, 1, 2, 3]
    assert launch.parse_gpus("2", 4) == [0, 1]
    assert launch.parse_gpus("0,2", 4) == [0, 2]
    for bad in ("5", "0,0", "1,x", "0,9"):
        with pytest.raises(launch.LaunchError, match="--gpus"):
            launch.parse_gpus(bad, 4)


@pytest.mark.parametrize("spec, expect", [
    (None, ["0", "1", "2", "3"]),
    ("2,3", ["2", "3"]),
    ("1, 3", ["1", "3"]),
    ("1,7,2", ["1"]),  # CUDA stops at the first entry that names no device
    ("-1", []),
    ("", []),
    ("GPU-5ce2096b,GPU-77aa", ["GPU-5ce2096b", "GPU-77aa"]),
])
def test_visible_gpus_read_cuda_visible_devices_as_cuda_does(monkeypatch, spec, expect):
    monkeypatch.setattr(launch, "_nvml_device_count", lambda: 4)
    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert launch.visible_gpus() == expect


@pytest.mark.slow
def test_sharded_runs_merge_into_the_single_run(tiny, tmp_path):
    for i in range(2):
        assert invoke("run", tiny, "--device", "cpu", "--shard", f"{i}/2", "--out", tmp_path / f"s{i}").exit_code == 0
    assert invoke("run", tiny, "--device", "cpu", "--out", tmp_path / "single").exit_code == 0
    r = invoke("merge", tmp_path / "merged", tmp_path / "s0", tmp_path / "s1")
    assert r.exit_code == 0, r.output
    merged_keys, merged = keys(tmp_path / "merged")
    single_keys, single = keys(tmp_path / "single")
    assert merged_keys == single_keys and not merged.duplicated(KEY).any()
    status = lambda t: dict(zip(map(tuple, t[KEY].values), t["status"]))  # noqa: E731
    assert status(merged) == status(single)
    meta = json.loads((tmp_path / "merged" / run_folder.META).read_text())
    assert len(meta["shards"]) == 2 and meta["state"] == "complete" and "--shard" not in meta["command"]
    assert "sharding" not in meta and [m["sharding"]["index"] for m in meta["shards"]] == [0, 1]
    samples = pd.read_csv(tmp_path / "merged" / run_folder.SAMPLES)
    assert set(samples["kind"]) == {"plan", "kernel"}
    # published folders carry no journal: merging them again works from results.csv + samples.csv
    for i in range(2):
        (tmp_path / f"s{i}" / run_folder.ROWS).unlink()
    assert invoke("merge", tmp_path / "again", tmp_path / "s0", tmp_path / "s1").exit_code == 0
    assert keys(tmp_path / "again")[0] == single_keys
    assert len(pd.read_csv(tmp_path / "again" / run_folder.SAMPLES)) == len(samples)


@pytest.mark.slow
def test_merge_refuses_overlaps_and_other_scenarios(tiny, tmp_path):
    assert invoke("run", tiny, "--device", "cpu", "--shard", "0/2", "--out", tmp_path / "a").exit_code == 0
    r = invoke("merge", tmp_path / "m", tmp_path / "a", tmp_path / "a")
    assert r.exit_code == 2 and "overlapping shards" in r.output
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("window_left = [3, 15, 31]", "window_left = [3]"))
    assert invoke("run", other, "--device", "cpu", "--out", tmp_path / "b").exit_code == 0
    r = invoke("merge", tmp_path / "m2", tmp_path / "a", tmp_path / "b")
    assert r.exit_code == 2 and "different scenario files" in r.output
    assert invoke("run", tiny, "--device", "cpu", "--shard", "1/2", "--out", tmp_path / "c").exit_code == 0
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    (tmp_path / "c" / "meta.json").write_text(json.dumps({**meta, "patch": {"name": "fix", "sha256": "ab" * 32}}))
    r = invoke("merge", tmp_path / "m3", tmp_path / "a", tmp_path / "c")
    assert r.exit_code == 2 and "different patches" in r.output and not (tmp_path / "m3").exists()


def test_an_unfinished_shard_merges_only_with_partial_and_counts_the_whole_sweep(tiny, tmp_path):
    sweep = len(scenarios.load(tiny, impl_filter=["torch-trim"]).points)
    for i in range(2):
        r = invoke("run", tiny, "--device", "cpu", "--impl", "torch-trim", "--shard", f"{i}/2",
                   "--out", tmp_path / f"s{i}")
        assert r.exit_code == 0, r.output
    cut = tmp_path / "s1"  # as an interrupted worker leaves it: one row journaled, no table
    (cut / run_folder.ROWS).write_text((cut / run_folder.ROWS).read_text().splitlines(keepends=True)[0])
    (cut / run_folder.TABLE).unlink()
    meta = json.loads((cut / run_folder.META).read_text())
    assert meta["sharding"]["sweep_points"] == sweep
    (cut / run_folder.META).write_text(json.dumps({**meta, "state": "interrupted"}))
    r = invoke("merge", tmp_path / "m", tmp_path / "s0", cut)
    assert r.exit_code == 2 and f"{cut} (shard 1/2) is interrupted" in r.output and "--partial" in r.output
    assert not (tmp_path / "m").exists()
    r = invoke("merge", tmp_path / "m", tmp_path / "s0", cut, "--partial")
    assert r.exit_code == 0, r.output
    merged = json.loads((tmp_path / "m" / run_folder.META).read_text())
    recorded = len(pd.read_csv(tmp_path / "m" / run_folder.TABLE))
    assert merged["state"] == "incomplete" and merged["points"] == sweep and recorded < sweep
    r = invoke("summary", tmp_path / "m")
    assert f"this run is incomplete: {recorded} of {sweep} points recorded" in r.output, r.output
    # a shard missing altogether: the sweep's points still come from the shard that is there
    r = invoke("merge", tmp_path / "m0", tmp_path / "s0", "--partial")
    assert r.exit_code == 0 and json.loads((tmp_path / "m0" / run_folder.META).read_text())["points"] == sweep


@cpu_only
def test_gpus_need_cuda(tiny):
    r = invoke("run", tiny, "--gpus", "all")
    assert r.exit_code == 2 and "--gpus: no CUDA device" in r.output


def test_the_launcher_stops_its_workers_on_bad_input_and_keeps_nothing(tiny, tmp_path, monkeypatch):
    """The --gpus launcher starts its workers before checking the scenario in full; a bad --impl
    still exits 2 naming the field, and leaves neither the run folder nor the shards' folder."""
    monkeypatch.setattr(launch, "visible_gpus", lambda: ["0", "1"])
    r = invoke("run", tiny, "--gpus", "all", "--impl", "torch-tirm", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "--impl" in r.output and "torch-trim" in r.output
    assert not (tmp_path / "run").exists() and not launch.work_dir(tmp_path / "run").exists()
    r = invoke("run", tiny, "--gpus", "3", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "this node has 2 GPU(s)" in r.output


@pytest.mark.slow
def test_job_array_through_submitit_local_executor(small, tmp_path):
    pytest.importorskip("submitit")
    r = invoke("submit", small, "--shards", "2", "--executor", "local", "--out", tmp_path / "array",
               "--impl", "torch-trim")
    assert r.exit_code == 0, r.output
    merged_keys, merged = keys(tmp_path / "array")
    expect = sorted(p.key for p in scenarios.load(small, impl_filter=["torch-trim"]).points)
    assert merged_keys == expect and (merged["status"] == "pass").all()
    assert len(json.loads((tmp_path / "array" / run_folder.META).read_text())["shards"]) == 2


def test_more_shards_than_points_is_refused_before_anything_starts(tiny, tmp_path):
    points = len(scenarios.load(tiny, impl_filter=["torch-trim"]).points)
    r = invoke("submit", tiny, "--shards", "1000", "--executor", "local", "--out", tmp_path / "array",
               "--impl", "torch-trim")
    assert r.exit_code == 2 and f"the sweep has only {points} point(s)" in r.output, r.output
    assert not (tmp_path / "array").exists() and not launch.work_dir(tmp_path / "array").exists()


def test_local_array_runs_at_most_one_shard_per_core_at_once(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    arrays = []

    class Job:
        def __init__(self, folder):
            folder.mkdir(parents=True)
            (folder / run_folder.META).write_text(json.dumps({"state": "complete"}))

        def result(self):
            return 0

    class Executor:
        def __init__(self, folder):
            self.cluster = "local"

        def map_array(self, fn, args, indices, counts, folders):
            arrays.append(list(indices))
            return [Job(f) for f in folders]

    monkeypatch.setattr(submitit, "LocalExecutor", Executor)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    folders = launch.submit([], 5, tmp_path / "array", executor="local")
    assert arrays == [[0, 1], [2, 3], [4]] and len(folders) == 5
    assert launch.batches(5, local=False) == [range(0, 5)]  # a scheduler queues the whole array itself


@pytest.mark.slow
def test_one_worker_per_device_each_sees_only_its_own(small, tmp_path, monkeypatch):
    """The --gpus launch path with CPU workers: every worker is shown its own device (the launcher's
    visible GPU it stands for) and its share of the CPU threads, works its own shard, and the
    progress callback ends at the scenario's point count."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    heard = []
    workers = launch.Workers([str(small), "--device", "cpu", "--impl", "torch-trim"], [0, 1], tmp_path / "run",
                             visible=["3", "5"])
    folders = workers.wait(on_progress=heard.append, poll_s=0.05)
    assert all(0 < t < 120 for t in workers.ended_s)
    expect = sorted(p.key for p in scenarios.load(small, impl_filter=["torch-trim"]).points)
    tables = [keys(f)[1] for f in folders]
    assert sorted(k for t in tables for k in map(tuple, t[KEY].values)) == expect
    assert heard[-1] == len(expect) and heard == sorted(heard)
    logs = sorted(p.name for p in launch.work_dir(tmp_path / "run").glob("gpu*.log"))
    assert logs == ["gpu0.log", "gpu1.log"]
    metas = [json.loads((f / run_folder.META).read_text()) for f in folders]
    assert [m["cuda_visible_devices"] for m in metas] == ["3", "5"]
    assert [m["torch_threads"] for m in metas] == [launch.worker_threads(2)] * 2


AFFINE = """
implementations = ["torch-trim", "flex-window"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
[[sweep]]
mode = "verify"
draft_tokens = 4
prefix_len = [40, 90, 150]
window_left = [3, 15, 31, 63]
[[skip]]
when = "impl == 'flex-window' and window_left > 3"
reason = "flex on the smallest window only"
"""


def shards_of(where, points) -> set[int]:
    return {where[p.key] for p in points}


def test_a_cases_points_stay_together_and_compiled_ones_gather(write_scenario):
    s = scenarios.load(write_scenario(AFFINE))
    flex = [p for p in s.points if p.impl == "flex-window"]
    where = shards.assign(s, 2)  # estimated: flex's compile outweighs every other point here
    assert len(flex) == 3 and shards_of(where, [p for p in s.points if p not in flex]) == {1 - where[flex[0].key]}
    where = shards.assign(s, 2, {p.key: 1.0 for p in s.points})
    assert len(shards_of(where, flex)) == 1
    for case in s.cases:
        assert len(shards_of(where, [p for p in s.points if p.case == case and p not in flex])) == 1
    assert shards.assign(scenarios.load(write_scenario(AFFINE)), 2) == shards.assign(s, 2)  # the same in every process
    points = [sum(1 for p in s.points if where[p.key] == i) for i in range(2)]
    assert abs(points[0] - points[1]) <= 1, points


TWO_KERNELS = """
implementations = ["torch-trim", "flex-window"]
[fixed]
num_qo_heads = 4
num_kv_heads = 1
head_dim = 64
[[sweep]]
mode = "decode"
batch_size = [32, 64]
prefix_len = [100, 200, 300]
window_left = [7, 31]
"""


def test_each_compiled_kernel_stays_whole_but_kernels_spread(write_scenario):
    """Decode batches of 32 and 64 (x4 query heads per KV head) build two flex-decoding kernels.
    When FlexAttention's points are more than a shard's share, each kernel's points stay on one
    shard and the two kernels go to different shards."""
    s = scenarios.load(write_scenario(TWO_KERNELS))
    costs = {p.key: (10.0 if p.impl == "flex-window" else 0.1) for p in s.points}
    where = shards.assign(s, 2, costs)
    by_batch = [shards_of(where, [p for p in s.points if p.impl == "flex-window" and p.case.batch_size == b])
                for b in (32, 64)]
    assert [len(v) for v in by_batch] == [1, 1] and by_batch[0] != by_batch[1]
    assert set(shards.assign(s, 1, costs).values()) == {0}


def test_compiled_points_that_fit_in_a_share_stay_on_one_shard(write_scenario):
    """With enough other work to balance against, both kernels go to one worker: its one-time
    set-up is paid once and no two workers compile at once."""
    s = scenarios.load(write_scenario(TWO_KERNELS))
    flex = [p for p in s.points if p.impl == "flex-window"]
    where = shards.assign(s, 2, {p.key: 1.0 for p in s.points})
    assert len(shards_of(where, flex)) == 1
    assert shards_of(where, [p for p in s.points if p not in flex]) == {1 - where[flex[0].key]}


def test_measured_costs_balance_the_shards(write_scenario):
    s = scenarios.load(write_scenario(AFFINE))
    heavy = next(p for p in s.points if p.impl == "torch-trim")
    costs = {p.key: (100.0 if p is heavy else 1.0) for p in s.points}  # one point costs as much as all others
    where = shards.assign(s, 2, costs)
    assert [p for p in s.points if where[p.key] == where[heavy.key]] == [heavy]


@pytest.mark.slow
def test_costs_come_from_an_earlier_run(tiny, tmp_path):
    assert invoke("run", tiny, "--device", "cpu", "--out", tmp_path / "first").exit_code == 0
    table = pd.read_csv(tmp_path / "first" / run_folder.TABLE)
    assert (table["point_s"] > 0).all() and (table["workload_s"] >= 0).all()
    costs = shards.point_costs(tmp_path / "first")
    assert set(costs) == set(map(tuple, table[KEY].values))
    assert sum(costs.values()) == pytest.approx(table["point_s"].sum() + table.groupby("case_id")["workload_s"].first().sum())
    r = invoke("run", tiny, "--device", "cpu", "--shard", "1/2", "--costs-from", tmp_path / "first",
               "--out", tmp_path / "s1")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "s1" / run_folder.META).read_text())
    assert meta["sharding"]["count"] == 2 and "measured in" in meta["sharding"]["costs"]
    old = tmp_path / "old"
    (old).mkdir()
    for name in (run_folder.META, run_folder.SCENARIO, run_folder.SAMPLES):
        (old / name).write_bytes((tmp_path / "first" / name).read_bytes())
    table.drop(columns=["point_s", "workload_s"]).to_csv(old / run_folder.TABLE, index=False)
    r = invoke("run", tiny, "--device", "cpu", "--shard", "0/2", "--costs-from", old, "--out", tmp_path / "s0")
    assert r.exit_code == 2 and "no point_s column" in r.output and not (tmp_path / "s0").exists()
    r = invoke("run", tiny, "--device", "cpu", "--costs-from", tmp_path / "first", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "use it with --shard or --gpus" in r.output


@pytest.mark.slow
def test_interrupting_the_launch_stops_every_worker_and_keeps_their_rows(write_scenario, tmp_path):
    """Ctrl-C (or a scheduler's SIGTERM) in the launching process reaches the workers as SIGTERM:
    each keeps what it finished, marks its folder interrupted, and the same launch resumes it."""
    many = write_scenario(TINY.replace("window_left = [3, 15, 31]", "window_left = " + str(list(range(1, 16)))))
    work = launch.work_dir(tmp_path / "run")

    def stop_once_rows_arrive(rows):  # once every worker is under way
        if all(launch.rows_written(work / f"gpu{g}") for g in (0, 1)):
            raise KeyboardInterrupt

    args = [str(many), "--device", "cpu", "--impl", "torch-mask"]
    with pytest.raises(KeyboardInterrupt):
        launch.Workers(args, [0, 1], tmp_path / "run").wait(on_progress=stop_once_rows_arrive, poll_s=0.01)
    expect = sorted(p.key for p in scenarios.load(many, impl_filter=["torch-mask"]).points)
    kept = [len(run_folder.RunStore(work / f"gpu{g}").rows()) for g in (0, 1)]
    assert 0 < sum(kept) < len(expect)
    for g in (0, 1):
        meta = json.loads((work / f"gpu{g}" / run_folder.META).read_text())
        assert meta["state"] == "interrupted" and meta["rows"] == kept[g]
    folders = launch.Workers(args, [0, 1], tmp_path / "run").wait(poll_s=0.01)  # the same launch resumes
    assert sorted(k for f in folders for k in keys(f)[0]) == expect


@pytest.mark.slow
def test_a_worker_that_does_not_finish_fails_the_launch_and_keeps_the_rest(small, tmp_path):
    """A worker that exits with an error (here: CUDA asked for on a machine without it, exit 2) is a
    failed launch (exit 1 from the CLI), not a merge of what the others left."""
    from swabench.errors import RunFailed
    workers = launch.Workers([str(small), "--device", "cpu", "--impl", "torch-trim"], [0], tmp_path / "run",
                             visible=["0"])
    assert workers.wait(poll_s=0.05)
    broken = launch.Workers([str(small), "--device", "cuda"], [0], tmp_path / "other", visible=["0"])
    with pytest.raises(RunFailed, match="did not finish"):
        broken.wait(poll_s=0.05)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / run_folder.META).write_text(json.dumps({"state": "crashed"}))
    assert launch._state(crashed) == "crashed" and launch._state(tmp_path / "nothing") is None


# a shard count bounded by the points; shards whose records do not add up to their sweep never merge as complete
@pytest.mark.parametrize("spec", ["0/99999999999999999999999", "0/100000000", "0/13"])
def test_more_shards_than_points_is_refused_at_once(tiny, tmp_path, spec):
    points = len(scenarios.load(tiny, impl_filter=["torch-trim"]).points)
    assert points == 12
    r = invoke("run", tiny, "--device", "cpu", "--impl", "torch-trim", "--shard", spec, "--out", tmp_path / "s")
    assert r.exit_code == 2 and f"--shard {spec}" in r.output and "the sweep has only 12 point(s)" in r.output, \
        r.output
    assert not (tmp_path / "s").exists()


def test_every_shard_holds_a_point_up_to_as_many_shards_as_points(write_scenario):
    """12 cases of 3 points: past 12 shards a case's points are split rather than a shard left empty."""
    points = scenarios.load(write_scenario(TINY)).points
    for count in (12, 13, 24, len(points)):
        parts = [shards.shard(scenarios.load(write_scenario(TINY)), i, count).points for i in range(count)]
        assert all(parts), [len(p) for p in parts]
        assert sorted(p.key for part in parts for p in part) == sorted(p.key for p in points)


def test_the_launcher_refuses_more_gpus_than_points(write_scenario, tmp_path, monkeypatch):
    one = write_scenario(TINY.replace("prefix_len = [40, 90]", "prefix_len = 40").replace("[3, 15, 31]", "3")
                         .replace('mode = ["verify", "decode"]', 'mode = "decode"').replace("draft_tokens = 4\n", ""))
    monkeypatch.setattr(launch, "visible_gpus", lambda: ["0", "1"])
    r = invoke("run", one, "--gpus", "all", "--impl", "torch-trim", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "--gpus all: 2 shards, but the sweep has only 1 point(s)" in r.output, r.output
    assert not (tmp_path / "run").exists() and not launch.work_dir(tmp_path / "run").exists()


@pytest.fixture
def half(tiny, tmp_path):
    """Shard 0 of 2 of the torch-trim sweep: (its folder, the sweep's points)."""
    r = invoke("run", tiny, "--device", "cpu", "--impl", "torch-trim", "--shard", "0/2", "--out", tmp_path / "s0")
    assert r.exit_code == 0, r.output
    return tmp_path / "s0", len(scenarios.load(tiny, impl_filter=["torch-trim"]).points)


def with_sharding(folder, **sharding):
    meta = json.loads((folder / run_folder.META).read_text())
    meta["sharding"] = {k: v for k, v in {**meta["sharding"], **sharding}.items() if v is not None}
    (folder / run_folder.META).write_text(json.dumps(meta))


@pytest.mark.parametrize("index, count", [(0, -1), (0, 0), (-1, 2), (2, 2), (0, 10**9), (True, 2)])
def test_a_shard_recording_no_shard_of_its_sweep_is_refused(half, tmp_path, index, count):
    folder, points = half
    with_sharding(folder, index=index, count=count)
    for partial in ([], ["--partial"]):
        r = invoke("merge", tmp_path / "m", folder, *partial)
        assert r.exit_code == 2 and f"{folder}: its meta.json records the shard" in r.output, r.output
        assert f"not one of a sweep of {points} points" in r.output and not (tmp_path / "m").exists()


def test_a_shard_claiming_to_be_the_whole_sweep_merges_only_as_partial(half, tmp_path):
    folder, points = half
    with_sharding(folder, index=0, count=1)
    held = len((folder / run_folder.ROWS).read_text().splitlines())
    r = invoke("merge", tmp_path / "m", folder)
    assert r.exit_code == 2 and f"the shards hold {held} of the sweep's {points} points" in r.output, r.output
    assert "--partial" in r.output and not (tmp_path / "m").exists()
    r = invoke("merge", tmp_path / "m", folder, "--partial")
    assert r.exit_code == 0 and json.loads((tmp_path / "m" / run_folder.META).read_text())["state"] == "incomplete"


def test_a_billion_shards_from_before_the_sweep_was_recorded_merge_as_missing(half, tmp_path):
    folder, _ = half
    with_sharding(folder, count=10**9, sweep_points=None)
    r = invoke("merge", tmp_path / "m", folder)
    assert r.exit_code == 2 and "shard(s) 1/1000000000, 2/1000000000, 3/1000000000, 4/1000000000, ... (999999999 " \
                                "in all) missing" in r.output, r.output


def test_submitting_says_what_it_does_at_once_and_as_each_shard_ends(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    said = []

    class Job:
        def __init__(self, folder):
            folder.mkdir(parents=True)
            (folder / run_folder.META).write_text(json.dumps({"state": "complete"}))

        def result(self):
            assert said, "nothing said before waiting on a shard"
            return 0

    class Executor:
        def __init__(self, folder):
            self.cluster = "local"

        def map_array(self, fn, args, indices, counts, folders):
            return [Job(f) for f in folders]

    monkeypatch.setattr(submitit, "LocalExecutor", Executor)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    launch.submit([], 3, tmp_path / "array", executor="local", say=said.append)
    assert said[0].startswith("submitting 3 shard(s) through submitit as local processes, 2 at once")
    assert said[1:] == [f"shard {i}/3 ended (exit 0, complete)" for i in range(3)]
