"""`python -m marl.bench.seeds` at tiny sizes (numbers mean nothing)."""

import json

from marl.bench.seeds import main


def test_the_seeds_benchmark_prints_its_table_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "seeds.json"
    argv = ["--seeds", "2", "--frames", "128", "--repeats", "1", "--num-envs", "8", "--rollout-length", "8"]
    main([*argv, "--minibatch-size", "32", "--hidden", "8", "--wide", "--json", str(out), "--log-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert "python -m marl.bench.seeds --seeds 2" in text and "| navigation | 2 seeds | 8 | 128 | 2 |" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["kind"] for r in rows] == ["1 seed", "2 seeds", "1 seed, 2 x envs"]
    assert rows[0]["ratio"] == 1.0 and rows[1]["returns_over"] == 2 and rows[2]["num_envs"] == 16
    assert (tmp_path / "navigation-1-0" / "aggregate.csv").exists()
