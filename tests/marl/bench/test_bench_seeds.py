"""`python -m marl.bench.seeds` at tiny sizes (numbers mean nothing)."""

import json
import types

import pytest

from marl.bench import seeds
from marl.bench.seeds import main


def not_json(constant: str):
    raise AssertionError(f"{constant} in the JSON: not JSON, strict readers refuse it")


def test_the_seeds_benchmark_prints_its_table_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "seeds.json"
    argv = ["--seeds", "2", "--frames", "128", "--repeats", "1", "--num-envs", "8", "--rollout-length", "8"]
    main([*argv, "--minibatch-size", "32", "--hidden", "8", "--wide", "--json", str(out), "--log-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert "python -m marl.bench.seeds --seeds 2" in text and "| navigation | 2 seeds | 8 | 128 | 2 |" in text
    rows = json.loads(out.read_text(), parse_constant=not_json)["rows"]
    assert [r["kind"] for r in rows] == ["1 seed", "2 seeds", "1 seed, 2 x envs"]
    # 16 steps of 100-step episodes: none ended, so no return; null in the JSON, nan in the table
    assert all(r["return_mean"] is None and r["return_ci"] == [None, None] for r in rows) and "nan (nan" in text
    assert rows[0]["ratio"] == 1.0 and rows[1]["returns_over"] == 2 and rows[2]["num_envs"] == 16
    assert (tmp_path / "navigation-1-0" / "aggregate.csv").exists()


def test_compiled_runs_are_timed_after_their_first_iteration(tmp_path, monkeypatch):
    # `--compile`: the first iteration compiles, so the seconds timed are the rest's (a stand-in trainer
    # reports cumulative `time_s` 10, 12.5, 15: 5 s after the first, 15 s for an eager run).
    class Trainer:
        def __init__(self, config):
            self.env, self.members = types.SimpleNamespace(groups={"agent": None}), [config.run.seed]

        def train(self):
            return [{"time_s": t, "agent/episode_return": 1.0} for t in (10.0, 12.5, 15.0)]

    monkeypatch.setattr(seeds, "Trainer", Trainer)
    compiled = seeds.config_for("navigation", "1 seed", 2, 3 * 64, 0, "cpu", str(tmp_path), seeds.Sizes(compile=True))
    assert compiled.run.compile
    assert seeds.time_run(compiled)["seconds"] == 5.0
    eager = seeds.config_for("navigation", "S seeds", 2, 3 * 64, 0, "cpu", str(tmp_path), seeds.Sizes())
    assert not eager.run.compile and seeds.time_run(eager)["seconds"] == 15.0


def test_compiled_runs_need_more_than_one_iteration(capsys):
    with pytest.raises(SystemExit):
        main(["--compile", "--frames", "64", "--num-envs", "8", "--rollout-length", "8"])
    assert "--frames must exceed one iteration (64 frames" in capsys.readouterr().err
