"""Caches as engines leave them (the ``cache_fill`` axis, core.stale): the slots no query may read hold NaN, Inf or
large values, the keys a request holds stay the control's, the reference never reads the fill, a path that lets it
in is caught, and FA4's documented precondition is an xfail, not a bug."""

import dataclasses

import pandas as pd
import pytest
import torch
from conftest import invoke

from swabench.core import footprint, gate, probes, reference, semantics, stale, workloads
from swabench.impls import embedded, fa4, upstream
from swabench.inputs import axes, scenarios
from swabench.inputs.axes import ScenarioError
from swabench.run.sweep import verdict
from swabench.store import run_folder, schema

BASE = dict(mode="verify", draft_tokens=4, prefix_len=40, window_left=15, page_size=16, num_qo_heads=4,
            num_kv_heads=2, head_dim=64, batch_size=3)
LAYOUTS = [("paged", "scattered"), ("paged", "contiguous"), ("paged", "evicted-null"), ("paged", "evicted-reused"),
           ("ragged", "scattered")]


def case(**kw):
    return axes.make_case({**BASE, **kw})


def held_rows(w) -> torch.Tensor:
    """A bool per flat K/V row: a request holds a key of its own there."""
    held = torch.zeros(w.k_store.numel() // (w.case.num_kv_heads * w.case.head_dim), dtype=torch.bool)
    held[w.slots if w.evicted is None else w.slots[~w.evicted]] = True
    return held


# ---------------------------------------------------------------- the axis

def test_a_bad_fill_is_refused_naming_the_field_and_the_values():
    with pytest.raises(ScenarioError, match=r"s\.toml: sweep\.cache_fill: must be one of random, nan, inf, large; "
                                            r"got 'nans' \(did you mean 'nan'\?\)"):
        axes.check_axes({"cache_fill": ["random", "nans"]}, "s.toml", "sweep")


def test_inf_in_an_fp8_cache_is_refused_saying_why():
    with pytest.raises(ScenarioError, match=r"sweep\.cache_fill: float8_e4m3 has no infinity"):
        case(cache_fill="inf", kv_dtype="float8_e4m3")
    assert case(cache_fill="nan", kv_dtype="float8_e4m3").cache_fill == "nan"


def test_a_bad_fill_in_a_file_exits_2_before_any_work(tmp_path, write_scenario):
    path = write_scenario('name = "t"\nimplementations = ["torch-trim"]\n[[sweep]]\nmode = "decode"\n'
                          'prefix_len = 40\nwindow_left = 15\ncache_fill = ["nan", "zero"]\n')
    r = invoke("check", path, "--out", tmp_path / "run", "--device", "cpu")
    assert r.exit_code == 2 and "cache_fill: must be one of random, nan, inf, large; got 'zero'" in r.output
    assert not (tmp_path / "run").exists()


def test_an_old_case_keeps_its_id_and_a_fill_is_a_case_of_its_own():
    plain = axes.make_case(dict(mode="extend", extend_len=512, prefix_len=8192, window_left=127, batch_size=32,
                                num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", page_size=16))
    assert plain.case_id == "e0513591dc82"  # its id in the published runs
    assert dataclasses.replace(plain, cache_fill="random").case_id == plain.case_id and "fill" not in plain.label
    filled = dataclasses.replace(plain, cache_fill="nan")
    assert filled.case_id != plain.case_id and "fill-nan" in filled.label


def test_the_values_written():
    assert stale.value("random", torch.bfloat16) is None
    assert torch.isnan(torch.tensor(stale.value("nan", torch.bfloat16)))
    assert stale.value("inf", torch.float16) == float("inf")
    assert stale.value("large", torch.float16) == 32752.0
    assert stale.value("large", torch.float8_e4m3fn) == 224.0
    w = workloads.build(case(cache_fill="large"))  # half the largest bf16 is itself a bf16: written exactly
    assert float(w.k_store.view(-1)[w.unheld[0] * 2 * 64]) == torch.finfo(torch.bfloat16).max / 2


# ---------------------------------------------------------------- the workload

@pytest.mark.parametrize("storage,layout", LAYOUTS)
def test_every_slot_no_request_holds_holds_the_fill_and_its_keys_stay_the_controls(storage, layout):
    control = workloads.build(case(storage=storage, page_layout=layout))
    w = workloads.build(case(storage=storage, page_layout=layout, cache_fill="nan"))
    held = held_rows(w)
    for store in (w.k_store, w.v_store):
        rows = store.view(len(held), -1)
        assert torch.isnan(rows[~held]).all() and not torch.isnan(rows[held]).any()
    assert (~held).sum() > 0
    for b in range(w.batch_size):  # each request's own keys: the control's numbers, value for value
        own = slice(None) if w.evicted is None else ~w.evicted[w.key_request == b]
        assert torch.equal(w.keys(b)[own], control.keys(b)[own])
        assert torch.equal(w.values(b)[own], control.values(b)[own])
    assert torch.equal(w.q, control.q)


def test_a_spare_page_follows_each_requests_last_page():
    w = workloads.build(case(page_layout="contiguous", cache_fill="inf"))
    pages = w.kv_indptr_host.diff().tolist()  # 44 keys: 3 pages a request, the last 12 keys full
    assert pages == [3, 3, 3] and w.k_store.shape[0] == 9 + 3
    assert w.kv_indices_host.tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]  # spare pages 3, 7 and 11
    spare = w.k_store[[3, 7, 11]]
    assert torch.isinf(spare).all() and torch.isinf(w.k_store[2, 12:]).all() and torch.isfinite(w.k_store[2, :12]).all()
    scattered = workloads.build(case(cache_fill="inf"))
    last = scattered.kv_indices_host[scattered.kv_indptr_host[1:] - 1]
    assert torch.isinf(scattered.k_store[last + 1]).all()  # past a request's last page: always a spare one


def test_a_ragged_buffer_has_spare_rows_past_the_last_request():
    w = workloads.build(case(storage="ragged", cache_fill="nan"))
    total = sum(w.kv_lens)
    assert w.k_store.shape[0] == total + stale.SPARE_ROWS
    assert torch.isnan(w.k_store[total:]).all() and not torch.isnan(w.k_store[:total]).any()


@pytest.mark.parametrize("storage,layout", LAYOUTS)
def test_the_reference_never_reads_the_fill(storage, layout):
    outputs = {}
    for fill in ("random", "nan"):
        w = workloads.build(case(storage=storage, page_layout=layout, cache_fill=fill))
        outputs[fill] = [reference.attention(w)]
        probes.fill(w, 0, seed=0)
        outputs[fill].append(reference.attention(w))
        if fill == "nan":
            assert torch.isnan(w.k_store.view(-1, 2, 64)[w.unheld]).all()  # the probes keep the fill in place
    for control, filled in zip(outputs["random"], outputs["nan"]):
        assert torch.equal(control, filled)


def test_the_memory_estimate_counts_the_spare_room():
    for c in (case(cache_fill="nan"), case(storage="ragged", cache_fill="large"),
              case(page_layout="evicted-null", cache_fill="nan")):
        w = workloads.build(c)
        assert footprint.footprint(c).kv_bytes == 2 * w.k_store.numel() * w.k_store.element_size()
        control = dataclasses.replace(c, cache_fill="random")
        assert footprint.footprint(c).kv_bytes > footprint.footprint(control).kv_bytes


# ---------------------------------------------------------------- the gate

class WholeTiles:
    """A path that loads every row of a request's tiles, pages (paged) or 16-row blocks (ragged), the rows past
    its last key too, and masks only their scores: what a kernel that loads whole tiles does."""

    TILE = 16

    def __init__(self, w, unwritten_request: int | None = None):
        self.w, self.unwritten = w, unwritten_request
        self.out = torch.empty_like(w.q)

    def plan(self) -> None:
        pass

    def run(self) -> None:
        w, c = self.w, self.w.case
        k_rows, v_rows = (s.view(-1, c.num_kv_heads, c.head_dim) for s in (w.k_store, w.v_store))
        for b, (qo, kv) in enumerate(zip(w.qo_lens, w.kv_lens)):
            if b == self.unwritten:
                continue
            if c.storage == "paged":
                pages = w.kv_indices_host[w.kv_indptr_host[b]:w.kv_indptr_host[b + 1]]
                rows = (pages[:, None] * c.page_size + torch.arange(c.page_size)).flatten()
            else:
                rows = int(w.slot_indptr[b]) + torch.arange(-(-kv // self.TILE) * self.TILE)
                rows = rows[rows < len(k_rows)]  # a load past the buffer's end reads zeros
            j, p = torch.arange(len(rows)), kv - qo + torch.arange(qo)
            seen = (j[None] <= p[:, None]) & (j[None] >= p[:, None] - c.window_left) & (j[None] < kv)
            lo, hi = w.qo_indptr_host[b:b + 2]
            o = embedded.attend(w.q[lo:hi].transpose(0, 1), k_rows[rows].transpose(0, 1), v_rows[rows].transpose(0, 1),
                                seen, w.sm_scale, 0.0, None)
            self.out[lo:hi] = o.transpose(0, 1)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_a_path_that_loads_past_the_last_key_passes_the_control_and_is_caught_under_nan(storage):
    control = workloads.build(case(storage=storage))
    assert gate.check(WholeTiles(control), control).passed
    for fill in ("nan", "inf"):
        w = workloads.build(case(storage=storage, cache_fill=fill))
        result = gate.check(WholeTiles(w), w)
        assert not result.passed and result.unwritten_rows > 0
        assert f"of them written with zeros in place of the cache's {fill} where no query may read" in result.reason
        assert torch.isnan(w.k_store.view(-1, 2, 64)[w.unheld]).all() == (fill == "nan")  # the fill put back


@pytest.mark.parametrize("layout", ["evicted-null", "evicted-reused"])
def test_a_path_that_gathers_the_whole_table_reads_the_freed_pages(layout):
    from swabench.impls import registry

    w = workloads.build(case(page_layout=layout, prefix_len=100, cache_fill="nan"))
    verdicts = {}
    for name in ("torch-trim", "torch-mask"):
        runner = registry.get(name).make(w, "torch")
        runner.plan()
        verdicts[name] = gate.check(runner, w)
    assert verdicts["torch-trim"].passed
    assert "of them written with zeros in place of the cache's nan" in verdicts["torch-mask"].reason


def test_rows_never_written_are_told_from_rows_the_fill_reached():
    full = workloads.build(case(page_size=4, cache_fill="nan"))  # 44 keys: every last page full, nothing past a key
    missing = gate.check(WholeTiles(full, unwritten_request=1), full)  # request 1's 4 queries x 4 heads
    assert missing.reason.startswith("16 output rows never written (as many with zeros where the cache holds nan)")
    assert torch.isnan(full.k_store.view(-1, 2, 64)[full.unheld]).all()  # the fill put back after the zeros


# ---------------------------------------------------------------- FA4's documented precondition

def fa4_case(**kw):
    return axes.make_case({**dict(mode="decode", prefix_len=1000, window_left=127, page_size=128, num_qo_heads=8,
                                  num_kv_heads=2, head_dim=128, batch_size=2, cache_fill="nan"), **kw})


def test_fa4s_key_tile_is_its_sm90_table():
    tile = lambda d, w: fa4.kv_tile(fa4_case(head_dim=d, window_left=w))  # noqa: E731
    assert [tile(d, 127) for d in (64, 128, 192, 256)] == [128, 128, 96, 64]
    assert [tile(d, -1) for d in (64, 128, 192, 256)] == [128, 128, 112, 80]


def test_fa4s_precondition_holds_only_where_its_tma_page_holds_nan_or_inf_past_a_key():
    shows = lambda **kw: upstream.hit("fa4-window", fa4_case(**kw), "fa4")  # noqa: E731
    assert shows().ref == shows(cache_fill="inf").ref == "fa4-tma-page-finite"
    assert shows().documented.startswith("flash-attn-4 4.0.0b36, flash_attn/cute/interface.py:4277")
    assert shows(cache_fill="large") is None and shows(cache_fill="random") is None  # finite: nothing asked
    assert shows(page_size=16) is None  # cp.async rows: not the documented load
    assert shows(prefix_len=1023) is None  # 1024 keys: every last page full
    assert shows(storage="ragged") is None
    assert upstream.hit("fa4-window-count", fa4_case(), "fa4").ref == "fa4-tma-page-finite"
    assert upstream.hit("paged-window", fa4_case(), "fa2") is None


def test_a_documented_precondition_is_an_xfail_that_says_so_and_nothing_to_file():
    from swabench.repro import bugs

    declared = upstream.get("fa4-tma-page-finite")
    status, reason = verdict(False, False, False, declared)
    assert status == "xfail" and reason.startswith("documented precondition fa4-tma-page-finite: ")
    assert reason.endswith("(flash-attn-4 4.0.0b36, flash_attn/cute/interface.py:4277-4281 (flash_attn_varlen_func's "
                           "docstring, page_table))")
    assert verdict(False, False, True, declared)[0] == "pass"
    assert "fa4-tma-page-finite" not in {b.ref for b in bugs.catalogue()}
    assert upstream.get("flashinfer#4972").describe().startswith("upstream bug flashinfer#4972: ")



def test_fa3s_varlen_shape_is_a_precondition_only_on_a_ragged_buffer_with_nan_or_inf_past_its_keys():
    from swabench.repro import bugs

    def shows(impl="fa3-window", **kw):
        return upstream.hit(impl, fa4_case(**{"storage": "ragged", **kw}), "vllm-fa3")

    assert shows().ref == shows(cache_fill="inf").ref == shows("fa3-window-count").ref == "fa3-varlen-total-k"
    assert shows().documented.startswith("vllm 0.26.0, vllm/vllm_flash_attn/flash_attn_interface.py:240-241")
    assert shows(cache_fill="large") is None and shows(cache_fill="random") is None  # finite rows: nothing asked
    assert shows(storage="paged") is None  # a block table: the pages past seqused_k may hold anything
    assert upstream.hit("sglang-fa3", fa4_case(storage="ragged"), "sgl-fa3") is None
    assert upstream.hit("ragged-window", fa4_case(storage="ragged"), "fa3") is None  # FlashInfer's own wrapper
    assert "fa3-varlen-total-k" not in {b.ref for b in bugs.catalogue()}

def test_no_script_is_written_for_a_filled_case():
    from swabench.repro import script, trace

    with pytest.raises(trace.Unrenderable, match="cache_fill 'nan' has no script yet"):
        script.traced(script.Part(case(cache_fill="nan"), "torch-trim", "torch"))


# ---------------------------------------------------------------- a CPU run, its table and its section

RUN = """
name = "stale-tiny"
implementations = ["torch-trim", "flex-window"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
batch_size = 2
prefix_len = 40
window_left = 15
cache_fill = ["random", "nan", "large"]
[[sweep]]
mode = ["verify", "decode"]
draft_tokens = 4
storage = ["paged", "ragged"]
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stale")
    (folder / "s.toml").write_text(RUN)
    r = invoke("check", folder / "s.toml", "--out", folder / "run", "--device", "cpu")
    assert r.exit_code == 1, r.output  # eager FlexAttention lets the NaN in
    return folder / "run"


def test_the_fill_goes_through_the_table_and_older_tables_read_random(tiny_run):
    from swabench.analysis import derived

    table, _ = derived.load(tiny_run)
    assert table["cache_fill"].value_counts().to_dict() == {"random": 8, "nan": 8, "large": 8}
    cases = {p.case.case_id: p.case for p in scenarios.load(tiny_run / schema.SCENARIO).points}
    assert all(cases[i].cache_fill == f for i, f in zip(table["case_id"], table["cache_fill"]))
    old = pd.read_csv(tiny_run / run_folder.TABLE).drop(columns="cache_fill")
    assert set(schema.migrate_table(old)["cache_fill"]) == {"random"}
    flex = table[table["impl"] == "flex-window"].set_index("cache_fill")["status"]
    assert set(flex["nan"]) == {"fail"} and set(flex["random"]) == set(flex["large"]) == {"pass"}
    assert set(table.loc[table["impl"] == "torch-trim", "status"]) == {"pass"}


def test_a_committed_table_reads_the_fill_nan_as_written(tiny_run, tmp_path):
    """A committed run keeps its table and drops its journal: the fill ``nan`` must not read back as a missing
    value (which the comparisons would take for a random cache)."""
    from swabench.analysis import derived

    committed = tmp_path / "run"
    committed.mkdir()
    for name in (run_folder.TABLE, schema.META, schema.SCENARIO):
        (committed / name).write_bytes((tiny_run / name).read_bytes())
    table, _ = derived.load(committed)
    assert table["cache_fill"].value_counts().to_dict() == {"random": 8, "nan": 8, "large": 8}
    assert table["median_us"].isna().any()  # an empty cell is still missing


def test_the_stale_section_counts_each_paths_points_per_fill(tiny_run):
    from swabench.publish import findings, sections

    run = findings.load([tiny_run])[0]
    made = sections.by_key("stale").table(run)
    t = run.table
    for row in made.to_dict("records"):
        mine = t[(t["impl"] == row["impl"]) & (t["backend"] == row["backend"]) & (t["cache_fill"] == row["cache_fill"])]
        assert [row[s] for s in ("pass", "fail", "xfail")] == [int((mine["status"] == s).sum())
                                                               for s in ("pass", "fail", "xfail")]
    assert made[["impl", "cache_fill"]].values.tolist()[:3] == [["torch-trim", "random"], ["torch-trim", "nan"],
                                                                  ["torch-trim", "large"]]
    flex_nan = made[(made["impl"] == "flex-window") & (made["cache_fill"] == "nan")].iloc[0]
    assert flex_nan["failed where"] == "page 16 (scattered), ragged; head_dim 64; verify, decode; window 16"
    text = "\n".join(sections.by_key("stale").for_runs([run]))
    assert "`flex-window` [flex] lets slots no query may read into its output: `nan` on 4 points (page 16" in text
    assert "Every fill passed on `torch-trim` [torch]" in text
    control = findings.load([tiny_run])[0]
    control.table = control.table.assign(cache_fill="random")
    assert sections.by_key("stale").table(control).empty  # a run of random caches has no such table


def test_a_filled_cache_is_not_a_plain_row():
    from swabench.analysis import versus

    t = pd.DataFrame({"impl": ["a"] * 3, "cache_fill": ["random", "nan", None], "sinks": False,
                      "logits_soft_cap": 0.0, "kv_dtype": "bfloat16", "dtype": "bfloat16"})
    assert versus.plain(t).index.tolist() == [0, 2]  # a table from before the axis held random data


def test_the_stale_scenario_sweeps_every_fill_over_fa4s_tma_and_row_pages():
    points = scenarios.load(scenarios.find("stale")).points
    assert {p.case.cache_fill for p in points} == {"random", "nan", "inf", "large"}
    fa4_pages = {(p.case.page_size, p.case.head_dim, fa4.loads_pages_by_tma(p.case)) for p in points
                 if p.impl == "fa4-window" and p.case.storage == "paged"}
    assert fa4_pages == {(16, 128, False), (128, 128, True), (64, 256, True)}
    declared = [p for p in points if upstream.hit(p.impl, p.case, p.backend)]
    assert declared and {p.case.cache_fill for p in declared} == {"nan", "inf"}
    assert {p.impl for p in points if p.backend == "torch"} == {"torch-trim", "torch-mask"}  # what a CPU runs
    assert {p.backend for p in points if p.impl.startswith(("fa3", "sglang-fa3"))} == {"vllm-fa3", "sgl-fa3"}
    assert len(points) < 600  # a few minutes on one GPU
