"""`marl bench`: its sections run and its time-to-target stops where it should."""

import json
import math
from dataclasses import replace

import pytest

from marl.bench import navigation_config, time_to_target
from marl.cli import main


def small_navigation(tmp_path, frames: int):
    config = navigation_config(frames, False, "cpu", str(tmp_path))
    return replace(config, env=replace(config.env, num_envs=32), algo=replace(config.algo, minibatch_size=512))


def test_time_to_target_stops_at_the_target_or_the_cap(tmp_path):
    seconds, frames, reached = time_to_target(small_navigation(tmp_path, 20_000), -math.inf)
    # 100-step episodes, 64-step iterations: episodes end in iterations 2, 4 and 5, the third with a return
    assert math.isfinite(seconds) and frames == 5 * 32 * 64
    seconds, frames, reached = time_to_target(small_navigation(tmp_path, 6_000), math.inf)
    assert math.isnan(seconds) and frames >= 6_000 and math.isfinite(reached)


def test_gae_section_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["bench", "--quick", "--device", "cpu", "--skip", "env", "train", "target", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "gae elements" in printed and "100x1024x3x1" in printed
    rows = json.loads(out.read_text())
    assert [r["benchmark"] for r in rows] == ["gae elements", "gae effective bandwidth"]
    assert all(r["vecmarl"] > 0 for r in rows)


def test_benchmarl_section_needs_a_python_with_benchmarl(tmp_path):
    """Without `--benchmarl-python` the section prints nothing; a missing interpreter is named."""
    out = tmp_path / "bench.json"
    main(["bench", "--quick", "--device", "cpu", "--skip", "env", "gae", "train", "target", "--json", str(out)])
    assert json.loads(out.read_text()) == []
    missing = str(tmp_path / "no-python")
    with pytest.raises(FileNotFoundError, match="the BenchMARL interpreter .*no-python.* was not found"):
        main(["bench", "--quick", "--skip", "env", "gae", "train", "target", "--benchmarl-python", missing])
