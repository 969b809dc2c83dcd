"""The serving axes (sinks, soft-cap, query scale, fp8 cache) and the serving known bugs on the CPU:
the reference against the definitions, the embedded paths through the gate, the gate's power over
each new mistake (the probe alone, at small windows and at W = 4095), and the exact must-fail sets."""

import math

import pytest
import torch

from swabench.publish.sections import Run, serving, speed
from swabench.analysis import derived, versus
from swabench.core import gate, reference, semantics, workloads
from swabench.inputs import axes, scenarios
from swabench.impls import embedded, implementation, registry

CASE = dict(mode="verify", draft_tokens=4, prefix_len=40, window_left=7, num_qo_heads=4, num_kv_heads=2,
            head_dim=64, batch_size=2)


def build(**kw):
    return workloads.build(axes.make_case({k: v for k, v in {**CASE, **kw}.items() if v is not None}))


def test_default_serving_axes_keep_every_published_case_id():
    """A run from before the serving axes: its scenario, expanded today, gives the ids it recorded."""
    from pathlib import Path
    folder = Path(__file__).parent / "fixtures" / "h200-run"
    table, _ = derived.load(folder)
    today = {c.case_id for c in scenarios.load(folder / "scenario.toml").cases}
    assert set(table["case_id"]) <= today
    plain = axes.make_case(dict(CASE))
    for axis, value in [("sinks", True), ("logits_soft_cap", 50.0), ("sm_scale", 0.1), ("kv_dtype", "float8_e4m3")]:
        other = axes.make_case({**CASE, axis: value})
        assert other.case_id != plain.case_id and other.label != plain.label
    assert axes.make_case({**CASE, "kv_dtype": "bfloat16"}).case_id == plain.case_id
    assert axes.make_case({**CASE, "sm_scale": 64 ** -0.5}).case_id == plain.case_id  # the default, spelt out


@pytest.mark.parametrize("axis,value,message", [
    ("sinks", 1, "true or false"), ("logits_soft_cap", -1, "number >= 0"), ("sm_scale", 0, "number > 0"),
    ("kv_dtype", "int8", "one of bfloat16, float16, float32, float8_e4m3"),
])
def test_bad_serving_axes_are_refused_by_name(write_scenario, axis, value, message):
    text = f'implementations = ["torch-trim"]\n[[sweep]]\nmode = "decode"\nprefix_len = 10\nwindow_left = 3\n' \
           f'{axis} = {value!r}\n'.replace("'", '"')
    with pytest.raises(axes.ScenarioError, match=f"sweep\\[0\\].{axis}: .*{message}"):
        scenarios.load(write_scenario(text))


def test_an_fp8_cache_needs_half_precision_queries():
    with pytest.raises(axes.ScenarioError, match="kv_dtype: an fp8 cache is read with bfloat16 or float16"):
        axes.make_case({**CASE, "dtype": "float32", "kv_dtype": "fp8"})
    with pytest.raises(axes.ScenarioError, match="kv_dtype: float16 with bfloat16 queries: a cache dtype other "
                                                      "than the queries' must be float8_e4m3"):
        axes.make_case({**CASE, "kv_dtype": "float16"})


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_soft_cap_and_scale_refuse_nan_and_inf(write_scenario, value):
    for axis in ("logits_soft_cap", "sm_scale"):
        text = f'implementations = ["torch-trim"]\n[[sweep]]\nmode = "decode"\nprefix_len = 10\nwindow_left = 3\n' \
               f'{axis} = {value}\n'
        with pytest.raises(axes.ScenarioError, match=f"sweep\\[0\\].{axis}: must be a number"):
            scenarios.load(write_scenario(text))


def explicit(w) -> torch.Tensor:
    """Attention from the definitions in docs/semantics.md, one query at a time, float64."""
    c, out = w.case, []
    group = c.num_qo_heads // c.num_kv_heads
    for b, (qo, kv) in enumerate(zip(w.qo_lens, w.kv_lens)):
        keys, values = w.keys(b).double(), w.values(b).double()
        for i, q in enumerate(w.queries(b).double()):
            p = kv - qo + i
            lo = max(0, p - c.window_left) if c.window_left >= 0 else 0
            rows = []
            for h in range(c.num_qo_heads):
                logits = c.scale * (keys[lo:p + 1, h // group] @ q[h])
                if c.logits_soft_cap:
                    logits = c.logits_soft_cap * torch.tanh(logits / c.logits_soft_cap)
                m = logits.max()
                weights = torch.exp(logits - m)
                denominator = weights.sum() + (math.exp(float(w.sinks[h]) - m) if w.sinks is not None else 0.0)
                rows.append(weights @ values[lo:p + 1, h // group] / denominator)
            out.append(torch.stack(rows))
    return torch.stack(out)


@pytest.mark.parametrize("shape", [dict(sinks=True), dict(logits_soft_cap=30.0), dict(sm_scale=0.05),
                                   dict(kv_dtype="float8_e4m3"), dict(sinks=True, logits_soft_cap=30.0, sm_scale=0.2)])
def test_reference_applies_each_axis_as_defined(shape):
    w = build(**shape)
    torch.testing.assert_close(reference.attention(w), explicit(w), rtol=1e-9, atol=1e-9)
    if "kv_dtype" in shape:
        assert w.k_store.dtype == torch.float8_e4m3fn and w.kv_dtype.itemsize == 1


def test_sinks_move_every_row_and_the_soft_cap_bends_the_logits():
    """The random pass must make each axis matter, or a path that ignores it would pass."""
    tolerance = gate.TOLERANCES["bfloat16"].rel_l2
    for shape, moved in ((dict(sinks=True), 10 * tolerance), (dict(logits_soft_cap=50.0), 4 * tolerance)):
        w = build(**shape)
        with_axis = reference.attention(w)
        plain = workloads.Workload(**{**vars(w), "case": axes.make_case(dict(CASE)), "sinks": None,
                                      "data": (), "references": {}})
        diff = with_axis - reference.attention(plain)
        assert diff.norm() / with_axis.norm() > moved, shape
        assert (diff.norm(dim=-1) / with_axis.norm(dim=-1)).min() > 1e-3, shape


@pytest.mark.parametrize("name", ["torch-trim", "torch-mask"])
@pytest.mark.parametrize("axes", [dict(sinks=True), dict(logits_soft_cap=50.0), dict(sm_scale=144 ** -0.5),
                                  dict(kv_dtype="float8_e4m3"), dict(sinks=True, logits_soft_cap=50.0),
                                  dict(sinks=True, dtype="float32"), dict(window_left=4095, prefix_len=4100,
                                                                          sinks=True, logits_soft_cap=50.0)])
def test_embedded_paths_apply_every_axis(name, axes):
    w = build(**axes)
    runner = registry.get(name).make(w, "torch")
    runner.plan()
    result = gate.check(runner, w)
    assert result.passed, result.reason


class Ignoring(embedded.GatherRunner):
    """A path that takes an axis and leaves it out: the gate must catch each."""

    def __init__(self, w, axis):
        super().__init__(w, implementation.computed, trim=True)
        self.axis = axis

    def run(self):
        w, c = self.w, self.w.case
        for lo, hi, slots, mask in self.parts:
            q = w.q[lo:hi].transpose(0, 1)
            k = w.k_store.view(-1, c.num_kv_heads, c.head_dim)[slots].transpose(0, 1).to(q.dtype)
            v = w.v_store.view(-1, c.num_kv_heads, c.head_dim)[slots].transpose(0, 1).to(q.dtype)
            o = embedded.attend(q, k, v, mask, c.head_dim ** -0.5 if self.axis == "sm_scale" else w.sm_scale,
                                0.0 if self.axis == "logits_soft_cap" else c.logits_soft_cap,
                                None if self.axis == "sinks" else w.sinks)
            self.out[lo:hi] = o.transpose(0, 1)


@pytest.mark.parametrize("axis,value", [("sinks", True), ("logits_soft_cap", 50.0), ("sm_scale", 144 ** -0.5)])
@pytest.mark.parametrize("window_left,prefix", [(7, 40), (4095, 4100)])
def test_the_gate_catches_a_path_that_ignores_an_axis(axis, value, window_left, prefix):
    w = build(**{axis: value, "window_left": window_left, "prefix_len": prefix})
    runner = Ignoring(w, axis)
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed, result
    if axis == "sinks":  # random rows at W = 4095 hold 4096 keys against one sink: the probe decides, with
        assert result.probe_rel_l2 > 0.5  # each sink level with its row's peak
    else:
        assert result.rel_l2 > 2 * gate.TOLERANCES["bfloat16"].rel_l2


def modelled(name, w):
    """A known bug's visible set, through the embedded gather: what the gate must catch."""
    return embedded.GatherRunner(w, registry.get(name).computes, trim=False)


BUGS = [  # (known bug, case axes where it must fail at a small window and at W = 4095)
    ("sglang-extend-nomask", dict(mode="extend", extend_len=16, draft_tokens=None, prefix_len=40, window_left=7)),
    ("sglang-extend-nomask", dict(mode="extend", extend_len=16, draft_tokens=None, prefix_len=4100, window_left=4095)),
    ("sglang-extend-ragged-nowindow", dict(mode="extend", extend_len=24, draft_tokens=None, prefix_len=8,
                                           window_left=7)),
    ("sglang-extend-ragged-nowindow", dict(mode="extend", extend_len=4100, draft_tokens=None, prefix_len=16,
                                           window_left=4095, batch_size=1, num_qo_heads=2, num_kv_heads=1)),
    ("eagle-verify-untrimmed", dict(prefix_len=40, window_left=7)),
    ("eagle-verify-untrimmed", dict(prefix_len=4100, window_left=4095)),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,axes", BUGS)
def test_each_serving_bug_is_caught_by_the_probe_alone(name, axes):
    w = build(**{k: v for k, v in axes.items()})
    assert registry.get(name).must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    runner = modelled(name, w)
    runner.plan()
    result = gate.check(runner, w)
    assert result.probe_rel_l2 > 10 * gate.TOLERANCES["bfloat16"].row_rel_l2, result


@pytest.mark.parametrize("name,qo,kv,page,must", [
    # SGLang's extend without the prefix mask: the table starts at the page holding prefix - W
    ("sglang-extend-nomask", 1, 41, 1, False),  # one query, token pages: exact
    ("sglang-extend-nomask", 2, 42, 1, True),   # the second query sees one prefix key too many
    ("sglang-extend-nomask", 1, 41, 16, True),  # pages bring keys from before the window
    ("sglang-extend-nomask", 1, 41, 3, False),  # prefix 40 - W 7 = 33: a page boundary
    ("sglang-extend-nomask", 4, 6, 16, False),  # the whole request inside the window
    ("sglang-extend-nomask", 4, 9, 16, True),   # ... until the last query's window leaves key 0
    # the ragged part without a window at plan: wrong once a query of the chunk is W + 1 past its first
    ("sglang-extend-ragged-nowindow", 8, 48, 16, False), ("sglang-extend-ragged-nowindow", 9, 49, 16, True),
    # EAGLE's untrimmed verify: the first min(prefix, W) + draft keys, no window at plan
    ("eagle-verify-untrimmed", 4, 8, 16, False),  # every key in every window
    ("eagle-verify-untrimmed", 4, 9, 16, True),   # the last query's window leaves key 0
    ("eagle-verify-untrimmed", 4, 44, 16, True),
])
def test_must_fail_sets_of_the_serving_bugs(name, qo, kv, page, must):
    mode = "verify" if name.startswith("eagle") else "extend"
    c = axes.make_case(dict(mode=mode, qo_len=qo, seq_len=kv, window_left=7, page_size=page))
    assert registry.get(name).must_fail(c, [qo], [kv], "fa2") is must


def test_dropped_sinks_must_fail_exactly_where_the_case_has_sinks():
    impl = registry.get("paged-sinks-dropped")
    for sinks in (False, True):
        c = axes.make_case({**CASE, "sinks": sinks})
        assert impl.must_fail(c, [4, 4], [44, 44], "fa2") is sinks


def test_minimum_bytes_count_the_cache_at_its_width():
    bf16 = sum(semantics.minimum_traffic([4], [44], 7, 4, 2, 64, 2))
    fp8 = sum(semantics.minimum_traffic([4], [44], 7, 4, 2, 64, 2, 1))
    kv_rows = semantics.window_keys(4, 44, 7)
    assert bf16 - fp8 == 2 * kv_rows * 2 * 64 and fp8 == 64 * (2 * 4 * 4 * 2 + 2 * kv_rows * 2)


def test_a_sliced_page_table_ends_inside_its_last_page():
    indptr, indices = torch.tensor([0, 4, 7]), torch.arange(10, 17)
    sliced = workloads.slice_page_table(indptr, indices, [16, 0], [50, 33], 16)
    assert sliced[0].tolist() == [0, 3, 6] and sliced[1].tolist() == [11, 12, 13, 14, 15, 16]
    assert sliced[2].tolist() == [2, 1]


def test_a_point_on_the_other_storage_is_a_skip_not_a_wrong_answer():
    paged = axes.make_case(dict(CASE))
    assert "runs on ragged storage, not paged" in registry.get("ragged-window").skip_reason(paged, "fa2", "cpu")


SERVING_CPU = """
name = "serving-cpu"
implementations = ["torch-trim", "torch-mask"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
dtype = "bfloat16"
[[sweep]]
mode = "verify"
draft_tokens = 4
prefix_len = 60
window_left = 15
sinks = [false, true]
logits_soft_cap = [0.0, 30.0]
kv_dtype = ["bfloat16", "fp8"]
"""


@pytest.mark.slow
def test_a_cpu_run_records_the_serving_axes_and_costs_each_feature_against_its_twin(write_scenario, tmp_path):
    from conftest import invoke, pages_text

    r = invoke("run", write_scenario(SERVING_CPU), "--out", tmp_path / "run", "--device", "cpu")
    assert r.exit_code == 0, r.output
    table, _ = derived.load(tmp_path / "run")
    assert set(table["status"]) == {"pass"} and len(table) == 16
    assert set(table["kv_dtype"]) == {"bfloat16", "float8_e4m3"} and set(table["wrapper"]) == {"torch"}
    assert len(versus.plain(table)) == 2
    costs = versus.feature_costs(table)
    # each point with a feature against the same shape, same path, with that feature off
    assert len(costs) == 3 * 8 and (costs["impl"] == costs["twin_impl"]).all()  # 8 points have each feature
    one = costs[(costs["feature"] == "sinks") & (costs["impl"] == "torch-trim") & (costs["logits_soft_cap"] == 0)
                & (costs["kv_dtype"] == "bfloat16")].iloc[0]
    twin = table[(table["impl"] == "torch-trim") & (~table["sinks"].astype(bool)) & (table["logits_soft_cap"] == 0)
                 & (table["kv_dtype"] == "bfloat16")].iloc[0]
    assert one["twin_us"] == twin["median_us"] and one["ratio"] == one["median_us"] / twin["median_us"]
    assert set(serving.feature_costs(Run("x", table, {}))["feature"]) == {"sinks", "soft_cap", "fp8_kv"}
    from swabench.publish import findings
    page = pages_text(findings.write([tmp_path / "run"], tmp_path / "FINDINGS.md"))
    section = page.split("## Sinks, soft-cap and fp8 caches")[1].split("\n## ")[0]
    assert f"From `{tmp_path / 'run'}`:" in section and "| soft_cap | verify | torch-trim |" in section


def test_the_sink_wrapper_is_costed_against_the_reference_path_and_decode_per_window_and_context():
    import pandas as pd

    base = dict(kind="correct", status="pass", storage="paged", mode="decode", batch_size=8, seq_len=None,
                qo_len=1, accept=None, window_left=127, sliding_window=128, page_size=16, page_layout="scattered",
                num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", seed=0, logits_soft_cap=0.0,
                sm_scale=128 ** -0.5, kv_dtype="bfloat16", backend="fa2", noise=0.01)
    rows = [dict(base, case_id=f"c{p}", prefix_len=p, impl=i, median_us=us, sinks=False)
            for p in (8192, 32768) for i, us in (("paged-window", 10.0), ("decode-window", 10.0 * p / 1024),
                                                 ("decode-tc-trim", 10.5))]
    rows += [dict(base, case_id="s", prefix_len=8192, impl="sink-window", median_us=12.0, sinks=True)]
    table = pd.DataFrame(rows)
    costs = versus.feature_costs(table)
    assert costs[["impl", "twin_impl", "twin_us", "ratio"]].values.tolist() == [["sink-window", "paged-window", 10.0,
                                                                                    1.2]]
    decode = speed.decode(Run("x", table, {}))
    assert decode["context"].tolist() == ["8192", "32768"]  # in numeric order, beside drawn mixes by summary
    assert decode["decode-window [fa2]"].tolist() == ["8.00x", "32.0x"]
    assert decode["decode-tc-trim [fa2]"].tolist() == ["1.05x", "1.05x"]
