"""`python -m envs.<name> [--policy scripted|random]`: the yardsticks the README quotes for training."""

import importlib
import re

import pytest


def demo_return(monkeypatch, capsys, name: str, policy: str) -> float:
    module = importlib.import_module(f"envs.{name}")
    monkeypatch.setattr("sys.argv", [name, "--policy", policy, "--num-envs", "64", "--steps", "100"])
    module._main()
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    return float(re.findall(r"-?\d+\.\d+", last_line)[-1])


@pytest.mark.parametrize("name", ["navigation", "spread", "speaker_listener", "tag"])
def test_the_scripted_controller_beats_random_actions(monkeypatch, capsys, name):
    scripted = demo_return(monkeypatch, capsys, name, "scripted")
    random = demo_return(monkeypatch, capsys, name, "random")
    assert scripted > random + 1.0, (name, scripted, random)
