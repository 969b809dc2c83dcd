import textwrap

import pytest
from conftest import shipped

from swabench.inputs import scenarios
from swabench.core.cases import MODES
from swabench.inputs.axes import ScenarioError

SHIPPED = ["cpu", "quick", "edges", "default", "peers", "workspace", "serving"]


def parse(text, tmp_path, name="s.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return scenarios.load(path)


BASE = """
implementations = ["torch-trim"]
[[sweep]]
mode = "verify"
draft_tokens = 4
prefix_len = 100
window_left = 16
"""


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_load(name):
    s = scenarios.load(scenarios.find(name))
    assert s.points and s.name == name and s.description
    assert len({p.key for p in s.points}) == len(s.points), "points are unique"


def test_cpu_scenario_runs_only_correct_embedded_implementations():
    s = scenarios.load(scenarios.find("cpu"))
    assert set(s.implementations) == {"torch-trim", "torch-mask"}
    assert {c.mode for c in s.cases} == set(MODES)
    assert {c.storage for c in s.cases} == {"paged", "ragged"}


def test_edges_scenario_sits_on_the_boundaries():
    s = shipped("edges")
    kv_minus_w = {c.seq_len - c.window_left for c in s.cases if c.seq_len is not None and not c.attention_chunk}
    assert kv_minus_w == {0, 1, 2}
    assert {c.page_size for c in s.cases} == {1, 16, None}
    assert any(c.num_qo_heads != c.num_kv_heads for c in s.cases)
    assert {c.prefix_len for c in s.cases if c.prefix_len is not None} >= {0}


def test_cartesian_expansion_and_ragged_collapse(tmp_path):
    s = parse(BASE.replace('window_left = 16', 'window_left = [8, 16]\npage_size = [1, 16]\n'
                           'storage = ["paged", "ragged"]').replace('["torch-trim"]', '["torch-trim", "torch-mask"]'),
              tmp_path)
    # paged: 2 windows x 2 page sizes; ragged: page_size does not apply, so 2 windows
    assert len(s.cases) == 6 and len(s.points) == 12
    assert {c.page_size for c in s.cases if c.storage == "ragged"} == {None}


def test_sliding_window_is_hf_convention(tmp_path):
    s = parse(BASE.replace("window_left = 16", "sliding_window = [17, -1]"), tmp_path)
    assert [c.window_left for c in s.cases] == [16, -1]
    assert [c.sliding_window for c in s.cases] == [17, -1]


def test_skip_rules_and_groups(tmp_path):
    s = parse(BASE.replace("window_left = 16", 'group = "g"\nwindow_left = [8, 200]') + textwrap.dedent("""
        [[skip]]
        when = "group == 'g' and window_left >= kv_len"
        reason = "window covers everything"
        """), tmp_path)
    assert [c.window_left for c in s.cases] == [8] and s.skipped == ["window covers everything"]


def test_case_id_is_stable_and_distinguishes_shapes(tmp_path):
    a = parse(BASE, tmp_path, "a.toml").cases[0]
    b = parse(BASE, tmp_path, "b.toml").cases[0]
    c = parse(BASE.replace("draft_tokens = 4", "draft_tokens = 5"), tmp_path, "c.toml").cases[0]
    assert a.case_id == b.case_id != c.case_id


@pytest.mark.parametrize("edit,field,words", [
    (("window_left = 16", "windw_left = 16"), "sweep[0].windw_left", ["unknown axis", "did you mean 'window_left'", "allowed:"]),
    (("window_left = 16", "window_left = -2"), "sweep[0].window_left", ["integer from -1 to", "-2"]),
    (("window_left = 16", "window_left = 16\npage_size = 0"), "sweep[0].page_size", ["from 1 to 65536", "got 0"]),
    (("prefix_len = 100", "seq_len = 3"), "sweep[0].draft_tokens", ["larger than seq_len 3"]),
    (('["torch-trim"]', '["torch-trimm"]'), "implementations", ["unknown implementation 'torch-trimm'", "did you mean 'torch-trim'", "allowed:"]),
    (('mode = "verify"', 'mode = "prefill"'), "sweep[0].mode", ["extend, verify, draft_extend, decode", "'prefill'"]),
    (("draft_tokens = 4", "extend_len = 4"), "sweep[0].extend_len", ["applies to modes 'extend' and 'mixed', not to mode 'verify'"]),
    (("window_left = 16", "window_left = 16\nnum_qo_heads = 6\nnum_kv_heads = 4"), "sweep[0].num_kv_heads", ["must divide"]),
    (("window_left = 16", "window_left = 16\nsliding_window = 17"), "sweep[0]", ["only one of window_left / sliding_window"]),
    (("window_left = 16", "window_left = 16\ndtype = 'float8'"), "sweep[0].dtype", ["bfloat16, float16, float32"]),
    (("implementations", "window_left = 3\nimplementations"), "window_left", ["sweep axes go under [fixed] or [[sweep]]"]),
    (("window_left = 16", "window_left = 16\nbatch_size = []"), "sweep[0].batch_size", ["empty list"]),
    (("window_left = 16", "window_left = 16\nhead_dim = 100"), "sweep[0].head_dim", ["multiple of 8"]),
    (("window_left = 16", "window_left = 9223372036854775807"), "sweep[0].window_left", ["from -1 to 2147483647"]),
    (("window_left = 16", "window_left = 4294967296"), "sweep[0].window_left", ["from -1 to 2147483647"]),
    (("window_left = 16", "sliding_window = 2147483649"), "sweep[0].sliding_window", ["from 1 to 2147483648"]),
    (("window_left = 16", "window_left = 5000\nhead_dim = 24"), "sweep[0].window_left",
     ["5000 is larger than the context (104 keys)", "give at most 3884, or -1"]),
    (("window_left = 16", "sliding_window = 5000\nhead_dim = 24"), "sweep[0].sliding_window", ["give at most 3885, or -1"]),
])
def test_validation_errors_name_file_field_and_allowed_values(tmp_path, edit, field, words):
    with pytest.raises(ScenarioError) as err:
        parse(BASE.replace(*edit), tmp_path)
    message = str(err.value)
    assert err.value.field == field and str(tmp_path / "s.toml") in message
    for w in words:
        assert w in message, message


@pytest.mark.parametrize("mode,queries,given,takes", [
    ("decode", "", "draft_tokens = 4", "modes 'verify' and 'draft_extend'"),
    ("extend", "extend_len = 8", "draft_tokens = 4", "modes 'verify' and 'draft_extend'"),
    ("verify", "draft_tokens = 4", "extend_len = 8", "modes 'extend' and 'mixed'"),
    ("verify", "draft_tokens = 4", "accept = 'geometric:0.5'", "mode 'draft_extend'"),
    ("draft_extend", "draft_tokens = 4", "tree = 'chain'", "mode 'verify'"),
    ("verify", "draft_tokens = 4", "prefills = 1", "mode 'mixed'"),
    ("decode", "", "block = 2", "modes 'extend', 'verify', 'draft_extend' and 'mixed'"),
])
def test_an_axis_the_groups_mode_does_not_use_is_refused(tmp_path, mode, queries, given, takes):
    """An axis only some modes use, given to a group of another mode, is refused naming the field, the group's mode
    and the modes that take it, rather than dropped (a decode group's draft_tokens would make a case without it)."""
    name = given.split(" =")[0]
    group = f'mode = "{mode}"\n{queries}\n{given}\nprefix_len = 100\nwindow_left = 16\n'
    with pytest.raises(ScenarioError) as err:
        parse(f'implementations = ["torch-trim"]\n[[sweep]]\n{group}', tmp_path)
    assert err.value.field == f"sweep[0].{name}"
    assert f"applies to {takes}, not to mode '{mode}' (leave it out)" in str(err.value)
    assert parse(f'implementations = ["torch-trim"]\n[[sweep]]\n{group.replace(given, "")}', tmp_path).points


def test_a_mode_axis_goes_to_the_modes_that_take_it_and_fixed_is_held_to_every_group(tmp_path):
    """A group of several modes gives draft_tokens to its verify cases; [fixed] is refused where no group's mode
    takes its axis, naming the modes the groups have."""
    both = parse(BASE.replace('mode = "verify"', 'mode = ["verify", "decode"]'), tmp_path)
    assert sorted(c.qo_len for c in both.cases) == [1, 4]
    with pytest.raises(ScenarioError) as err:
        parse(BASE.replace("[[sweep]]", "[fixed]\naccept = 'full'\n[[sweep]]"), tmp_path)
    assert err.value.field == "fixed.accept" and "applies to mode 'draft_extend', not to mode 'verify'" in str(err.value)


def test_largest_window_named_fits_the_probes(tmp_path):
    """The window the message offers is one the probes take; one more is refused again."""
    assert parse(BASE.replace("window_left = 16", "window_left = 3884\nhead_dim = 24"), tmp_path).cases
    with pytest.raises(ScenarioError, match="give at most 3884"):
        parse(BASE.replace("window_left = 16", "window_left = 3885\nhead_dim = 24"), tmp_path)
    assert parse(BASE.replace("window_left = 16", "window_left = 2147483647"), tmp_path).cases[0].window_left == 2 ** 31 - 1


def test_bad_skip_rule_names_the_rule(tmp_path):
    with pytest.raises(ScenarioError, match=r"skip\[0\].when: unknown name 'windw'"):
        parse(BASE + '[[skip]]\nwhen = "windw > 3"\nreason = "x"\n', tmp_path)
    with pytest.raises(ScenarioError, match=r"skip\[0\].when: only comparisons"):
        parse(BASE + '[[skip]]\nwhen = "__import__(\'os\')"\nreason = "x"\n', tmp_path)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read it"):
        scenarios.load(tmp_path / "missing.toml")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        parse("implementations = [", tmp_path)
    with pytest.raises(ScenarioError, match="no such file or scenario name"):
        scenarios.find("defualt")


def test_impl_filter(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace('["torch-trim"]', '["torch-trim", "torch-mask"]'))
    assert scenarios.load(path, impl_filter=["torch-mask"]).implementations == ["torch-mask"]
    with pytest.raises(ScenarioError, match="none of planted-wide is in this scenario"):
        scenarios.load(path, impl_filter=["planted-wide"])


CHOICE_AXES = ["mode", "storage", "page_layout", "dtype", "kv_dtype", "backend", "model"]


@pytest.mark.parametrize("axis", CHOICE_AXES)
@pytest.mark.parametrize("value", ["{a = 1}", "[[1]]", "[{x = 1}]"])
def test_a_table_or_list_where_a_name_belongs_is_refused_with_the_names(tmp_path, axis, value):
    with pytest.raises(ScenarioError) as err:
        parse(BASE.replace('mode = "verify"', "") + f"{axis} = {value}\n", tmp_path)
    assert err.value.field == f"sweep[0].{axis}" and "must be one of" in str(err.value)
    allowed = {"mode": MODES, "model": ["gemma-3-1b"], "dtype": ["bfloat16"]}.get(axis, [])
    assert all(name in str(err.value) for name in allowed), str(err.value)


def test_a_misspelt_model_gets_a_suggestion(tmp_path):
    with pytest.raises(ScenarioError, match=r"got 'gema-3-1b' \(did you mean 'gemma-3-1b'\?\)"):
        parse(BASE + 'model = "gema-3-1b"\n', tmp_path)


def test_a_file_nested_too_deeply_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="file: nested too deeply"):
        parse(BASE + "seq_len = " + "[" * 100_000 + "\n", tmp_path)


def test_a_file_over_the_cap_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text(BASE)
    monkeypatch.setattr(scenarios, "MAX_BYTES", len(BASE))
    assert scenarios.load(path).points  # exactly the cap: read
    monkeypatch.setattr(scenarios, "MAX_BYTES", len(BASE) - 1)
    with pytest.raises(ScenarioError, match=f"file: larger than {len(BASE) - 1} bytes"):
        scenarios.load(path)


@pytest.mark.parametrize("command", [["show"], ["check", "--device", "cpu"], ["run", "--device", "cpu"]])
def test_the_commands_refuse_an_endless_or_deep_file_with_exit_2(tmp_path, command):
    from conftest import invoke

    deep = tmp_path / "deep.toml"
    deep.write_text("mode = " + "[" * 100_000)
    for path, words in (("/dev/zero", "not a regular file but a character device"), (deep, "nested too deeply")):
        r = invoke(command[0], path, *command[1:], "--out", tmp_path / "out") if command[0] != "show" else \
            invoke("show", path)
        assert r.exit_code == 2 and words in r.output, r.output


@pytest.mark.parametrize("heads,group", [((8, 8), 1), ((64, 8), 8), ((40, 8), 5)])
def test_a_case_knows_its_gqa_group(heads, group):
    from swabench.inputs import axes

    case = axes.make_case({"mode": "decode", "batch_size": 2, "prefix_len": 64, "window_left": 15, "page_size": 16,
                           "num_qo_heads": heads[0], "num_kv_heads": heads[1]})
    assert case.gqa_group == group


def test_trace_window_past_int32_is_refused():
    """JSON takes any integer: a trace's window is held to the same bound as a scenario's."""
    from swabench.inputs import traces
    from swabench.errors import UserError
    line = b'{"mode": "decode", "requests": [[10, 1]], "head_dim": 64, "window_left": ' + b"1" + b"0" * 30 + b"}"
    with pytest.raises(UserError, match=r"line 1\.window_left: must be an integer from -1 to 2147483647"):
        traces.parse(line, "t.jsonl")


def test_wrapper_mode_makes_plain_points_of_the_wrapper_paths_alone(tmp_path):
    s = parse(BASE.replace('["torch-trim"]', '["torch-trim", "paged-window", "decode-tc-trim"]')
              + 'wrapper_mode = ["cuda-graph", "plain"]\n', tmp_path)
    plain = {p.impl for p in s.points if p.case.wrapper_mode == "plain"}
    graph = {p.impl for p in s.points if p.case.wrapper_mode == "cuda-graph"}
    assert plain == {"paged-window"} and graph == {"paged-window", "torch-trim"}  # decode-tc-trim: decode only
    default = parse(BASE, tmp_path, "d.toml").cases[0]
    graph_case = next(p.case for p in s.points if p.case.wrapper_mode == "cuda-graph")
    plain_case = next(p.case for p in s.points if p.case.wrapper_mode == "plain")
    assert graph_case.case_id == default.case_id != plain_case.case_id  # ids from before the axis stay
    assert plain_case.label.endswith("plain s0") and "cuda-graph" not in graph_case.label
    with pytest.raises(ScenarioError) as err:
        parse(BASE + 'wrapper_mode = "eager"\n', tmp_path, "bad.toml")
    assert err.value.field == "sweep[0].wrapper_mode" and "cuda-graph, plain" in str(err.value)


def test_case_selects_a_sweep_group_by_its_name():
    s = scenarios.select(scenarios.load(scenarios.find("serving")), ["modes-verify", "modes-extend"])
    assert {p.group for p in s.points} == {"modes-verify", "modes-extend"}
    assert {p.case.mode for p in s.points} == {"verify", "extend"} and {p.case.model for p in s.points} == {"gpt-oss-20b"}
    with pytest.raises(ScenarioError, match="part of a label or a group"):
        scenarios.select(scenarios.load(scenarios.find("serving")), ["modes-prefill"])
