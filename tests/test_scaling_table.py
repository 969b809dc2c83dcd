"""scripts/scaling_table.py reads the shell's `time` output per step of scripts/h200.sh."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "scaling_table.py"
spec = importlib.util.spec_from_file_location("scaling_table", SCRIPT)
scaling_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scaling_table)

LOG = """=== gpus 17:38:36
2 GPUs: wall time 100.3 s
real\t1m48.753s
user\t7m11.646s
=== default 17:40:25
sweep wall time 176.5 s
real\t3m6.860s
=== compare 17:43:32
"""


def test_each_steps_real_time_in_seconds_in_the_order_run():
    times = scaling_table.real_seconds(LOG)
    assert list(times) == ["gpus", "default"]
    assert times["gpus"] == 108.753 and times["default"] == 186.86


def test_the_committed_calls_tabulate():
    # two calls copied from results/h200x2-scaling, now in git history (call.log and the metas rows() reads): f ran
    # `--gpus` twice, g also ran one GPU at half the threads, so every kind of row is made
    root = Path(__file__).resolve().parent / "fixtures" / "scaling"
    rows = [r for p in sorted(root.iterdir()) if (p / "call.log").exists() for r in scaling_table.rows(p)]
    assert rows and all(r.count("|") == 12 and "x** |" in r for r in rows)
    assert any("(again)" in r for r in rows) and any("half the threads" in r for r in rows)


def test_a_wrong_argument_or_a_meta_it_cannot_read_is_exit_2(tmp_path, capsys):
    import json
    import shutil

    import pytest

    def refused(*argv) -> str:
        with pytest.raises(SystemExit) as exit_:
            scaling_table.main([str(a) for a in argv])
        assert exit_.value.code == 2
        return capsys.readouterr().err

    assert "ROOT" in refused(tmp_path / "missing")
    assert "unrecognized arguments" in refused(tmp_path, tmp_path)
    assert "no call folder" in refused(tmp_path)
    call = shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "scaling" / "f-2c26dce", tmp_path / "f")
    meta = json.loads((call / "2gpu-meta.json").read_text())
    (call / "2gpu-meta.json").write_text(json.dumps({**meta, "shards": [{"wall_s": "slow"}]}))
    assert "2gpu-meta.json" in refused(tmp_path)
    (call / "2gpu-meta.json").write_text("{")
    assert "2gpu-meta.json" in refused(tmp_path)
