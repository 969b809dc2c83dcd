"""Model presets: each one's axes make a valid case of every step, the scenario axis and the CLI's
--model reach them, and a shape FlashInfer is not built for is a skip that says so."""

from pathlib import Path

import pytest
from conftest import invoke

from swabench.publish.sections import Run, serving
from swabench.analysis import derived
from swabench.inputs import axes, models, scenarios
from swabench.impls import registry

STEPS = [dict(mode="extend", extend_len=2048, prefix_len=8192), dict(mode="verify", draft_tokens=16, prefix_len=16384),
         dict(mode="draft_extend", draft_tokens=16, prefix_len=16384), dict(mode="decode", prefix_len=32768)]


@pytest.mark.parametrize("name", list(models.MODELS))
def test_every_preset_makes_every_step(name):
    m = models.get(name)
    for step in STEPS:
        c = axes.make_case({**step, "model": name, "num_qo_heads": 1})  # the preset overrides the shape
        assert (c.num_qo_heads, c.num_kv_heads, c.head_dim) == (m.num_qo_heads, m.num_kv_heads, m.head_dim)
        assert c.window_left == m.window_left and c.sliding_window == m.sliding_window
        assert c.attention_chunk == m.attention_chunk
        assert c.sinks == m.sinks and c.logits_soft_cap == m.logits_soft_cap and c.model == name
        assert f"[{name}]" in c.label


def test_the_presets_carry_what_their_configs_say():
    assert models.get("gpt-oss-120b").axes() == dict(num_qo_heads=64, num_kv_heads=8, head_dim=64, window_left=127,
                                                      sinks=True, logits_soft_cap=0.0)
    assert models.get("gemma-2-27b").axes()["sm_scale"] == 144 ** -0.5
    assert "sm_scale" not in models.get("gemma-2-9b").axes()  # query_pre_attn_scalar 256 = head_dim
    assert models.get("gemma-3-27b").sm_scale == 168 ** -0.5 and models.get("gemma-3-1b").window_left == 511
    assert all(m.verified for m in models.MODELS.values())
    for name in ("llama-4-scout", "llama-4-maverick"):  # attention_chunk_size 8192 on 36 of 48 layers, no window
        assert models.get(name).axes() == dict(num_qo_heads=40, num_kv_heads=8, head_dim=128, window_left=-1,
                                                sinks=False, logits_soft_cap=0.0, attention_chunk=8192)
        assert "36 of 48" in models.get(name).layers


def test_phi3_head_dim_is_a_skip_on_flashinfer():
    c = axes.make_case(dict(mode="decode", prefix_len=4096, model="phi-3-mini"))
    assert "not 96" in registry.get("decode-tc-trim").unsupported(c, "fa2")


def test_a_group_that_gives_both_a_model_and_its_shape_is_refused(write_scenario):
    text = ('implementations = ["torch-trim"]\n[[sweep]]\nmode = "decode"\nprefix_len = 100\n'
            'model = "gemma-3-1b"\nnum_kv_heads = 2\n')
    with pytest.raises(axes.ScenarioError, match=r"sweep\[0\]\.num_kv_heads: the model preset sets num_kv_heads"):
        scenarios.load(write_scenario(text))
    with pytest.raises(axes.ScenarioError, match=r"model: must be one of gpt-oss-20b, .*; got 'llama'"):
        scenarios.load(write_scenario(text.replace("gemma-3-1b", "llama").replace("num_kv_heads = 2\n", "")))


def test_a_shape_in_fixed_beside_a_model_in_fixed_is_blamed_on_fixed(write_scenario):
    text = ('implementations = ["torch-trim"]\n[fixed]\nmodel = "gemma-3-1b"\nnum_qo_heads = 4\n'
            '[[sweep]]\nmode = "decode"\nprefix_len = 100\n')
    with pytest.raises(axes.ScenarioError, match=r": fixed\.num_qo_heads: the model preset sets num_qo_heads"):
        scenarios.load(write_scenario(text))


def test_an_unknown_model_name_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown model 'gpt-oss-12b' \(did you mean 'gpt-oss-120b'\?\); known: "):
        models.get("gpt-oss-12b")
    for command in ("check", "run", "show"):
        r = invoke(command, "--model", "gema-3-1b")
        assert r.exit_code == 2 and "--model: unknown model 'gema-3-1b' (did you mean 'gemma-3-1b'?)" in r.output


@pytest.mark.parametrize("cuda,args,template", [(False, [], "models-cpu.toml"), (True, [], "models.toml"),
                                                (False, ["--device", "cuda"], "models.toml"),
                                                (True, ["--device", "cpu"], "models-cpu.toml")])
def test_show_with_a_model_shows_the_template_run_would_use(monkeypatch, cuda, args, template):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    r = invoke("show", "--model", "gemma-3-1b", *args)
    assert r.exit_code == 0 and f"file: {scenarios.find(template.removesuffix('.toml'))}\n" in r.output, r.output


def test_models_lists_every_preset_with_its_source():
    r = invoke("models")
    assert r.exit_code == 0 and all(name in r.output for name in models.MODELS)
    assert "attn_logit_softcapping" in r.output and "checked instead against" in r.output


def test_each_preset_names_its_own_config_whether_it_is_gated_and_the_copies_read_instead():
    """A third-party copy (Alignment-Lab-AI/...) is named as what was read, beside the model's own repository and
    why it was not read; docs/models.md says the same per preset."""
    said = invoke("models").output
    docs = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    for m in models.MODELS.values():
        line = next(line for line in said.splitlines() if line.startswith(f"  {m.name}: own config "))
        assert f"https://huggingface.co/{m.hf_id}/blob/main/config.json" in line
        assert ("(gated: it opens only to an account that" in line) is bool(m.gated), m.name
        assert ("(public)" in line) is not bool(m.gated) and line.endswith(m.verified)
        row = next(row for row in docs.splitlines() if row.startswith(f"| `{m.name}` |"))
        assert f"[{m.hf_id}]({m.own})" in row and ("| gated: " in row) is bool(m.gated) and m.verified in row
    phi = models.get("phi-3-mini")
    assert "Alignment-Lab-AI" in phi.verified and not phi.gated and phi.hf_id == "microsoft/Phi-3-mini-4k-instruct"
    assert {m.name for m in models.MODELS.values() if m.gated} >= {"gemma-3-27b", "llama-4-scout", "mistral-7b-v0.1"}
    assert "the hub was not reachable from the machine that wrote these presets" in said


@pytest.mark.slow
def test_run_with_a_model_runs_its_cpu_template(tmp_path):
    r = invoke("run", "--model", "gemma-2-27b", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table, meta = derived.load(tmp_path / "run")
    assert meta["scenario"] == "models-cpu" and set(table["model"]) == {"gemma-2-27b"}
    ran = table[table["status"] != "skip"]
    assert set(ran["status"]) == {"pass"} and set(ran["impl"]) == {"torch-trim", "torch-mask"}
    assert (table["logits_soft_cap"] == 50).all() and (table["sm_scale"] == 144 ** -0.5).all()


@pytest.mark.parametrize("args,message", [(["run", "--model", "llama"], "--model: unknown model 'llama'"),
                                          (["check", "quick", "--model", "gemma-3-1b"], "no case of quick is for"),
                                          (["show"], "show needs SCENARIO or --model NAME")])
def test_bad_model_input_exits_2(args, message):
    r = invoke(*args)
    assert r.exit_code == 2 and message in r.output, r.output


@pytest.mark.slow
def test_every_preset_passes_on_the_embedded_paths(tmp_path):
    r = invoke("check", "models-cpu", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table, _ = derived.load(tmp_path / "run")
    ran = table[table["status"] != "skip"]
    assert set(ran["status"]) == {"pass"} and set(ran["model"]) == set(models.MODELS)


def test_the_report_names_the_fastest_path_per_model_and_step():
    import pandas as pd

    rows = [dict(model="gpt-oss-120b", mode="decode", storage="paged", impl=i, backend=b, kind="correct",
                 status="pass", median_us=us, case_id="c1")
            for i, b, us in (("decode-tc-trim", "fa2", 10.0), ("paged-window", "fa2", 11.0), ("decode-tc-trim", "fa3", 30.0))]
    rows.append(dict(rows[0], impl="decode-window", median_us=5.0, status="fail"))  # a failing path never counts
    rows.append(dict(rows[0], impl="decode-trim", median_us=1.0, sinks=False, logits_soft_cap=0.0))  # the plain twin
    out = serving.fastest_per_model(Run("x", pd.DataFrame(rows), {}))
    assert out.to_dict("records") == [{"model": "gpt-oss-120b", "step": "decode paged", "fastest": "decode-tc-trim [fa2]",
                                       serving.TIME: 10.0, serving.RUNNER_UP: "paged-window [fa2] 1.10x",
                                       serving.FA3_FA2: 3.0}]
    rows += [dict(rows[0], case_id="c2", median_us=20.0), dict(rows[1], case_id="c2", median_us=13.0)]
    two = serving.fastest_per_model(Run("x", pd.DataFrame(rows), {})).iloc[0]  # two steps: the mean over both, fa3 timed only one
    assert (two["fastest"], two[serving.TIME], two[serving.RUNNER_UP], two[serving.FA3_FA2]) == \
        ("paged-window [fa2]", 12.0, "decode-tc-trim [fa2] 1.25x", None)


def test_model_features_false_is_the_models_plain_twin(write_scenario):
    path = write_scenario("""
        implementations = ["torch-trim", "sink-window"]
        [fixed]
        model = ["gpt-oss-120b", "mistral-7b-v0.1"]
        model_features = [true, false]
        [[sweep]]
        mode = "decode"
        prefix_len = 300
        """)
    s = scenarios.load(path)
    cases = {(p.case.model, p.case.sinks, p.case.logits_soft_cap) for p in s.points}
    assert cases == {("gpt-oss-120b", True, 0.0), ("gpt-oss-120b", False, 0.0), ("mistral-7b-v0.1", False, 0.0)}
    assert len(s.points) == 4  # mistral has no features to drop: one case, not two
    assert [p.case.sinks for p in s.points if p.impl == "sink-window"] == [True]  # the sink wrapper needs sinks
    gemma = axes.make_case({"model": "gemma-2-9b", "model_features": False, "mode": "decode", "prefix_len": 9})
    assert (gemma.logits_soft_cap, gemma.head_dim, gemma.scale) == (0.0, 256, 256 ** -0.5)


def test_model_features_without_a_model_is_refused(write_scenario):
    path = write_scenario("""
        implementations = ["torch-trim"]
        [fixed]
        model_features = false
        [[sweep]]
        mode = "decode"
        prefix_len = 300
        window_left = 7
        """)
    with pytest.raises(axes.ScenarioError, match="model_features"):
        scenarios.load(path)


def test_the_layer_schedules_follow_the_configs_rules():
    """Each preset's layers as its config lays them out, counted as its cited config says."""
    for m in models.MODELS.values():
        assert f"{m.windowed_layers} of {m.num_layers}" in m.layers, m.name
        assert len(m.layer_types()) == m.num_layers
    types = {name: models.get(name).layer_types() for name in ("gemma-2-9b", "gpt-oss-20b", "gemma-3-1b",
                                                               "llama-4-scout", "mistral-7b-v0.1")}
    assert types["gemma-2-9b"][:4] == types["gpt-oss-20b"][:4] == ["window", "global"] * 2  # sliding first
    assert [i for i, t in enumerate(types["gemma-3-1b"]) if t == "global"] == [5, 11, 17, 23]
    assert [i for i, t in enumerate(types["llama-4-scout"]) if t == "global"] == list(range(3, 48, 4))
    assert set(types["mistral-7b-v0.1"]) == {"window"}


def test_the_presets_do_not_import_the_axes_that_import_them():
    """inputs.axes reads the presets; the presets import nothing of the axes (no import circle)."""
    import ast
    import inspect

    from swabench.inputs import models
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(models)))
                if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(inspect.getsource(models)))
                 if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name and name.startswith("swabench.inputs")}, imported
