"""`python -m envs.native.<name> [--policy scripted|random]`: the yardsticks the README quotes for training."""

import importlib
import re

import pytest


def demo_return(monkeypatch, capsys, name: str, policy: str) -> float:
    module = importlib.import_module(f"envs.native.{name}")
    monkeypatch.setattr("sys.argv", [name, "--policy", policy, "--num-envs", "64", "--steps", "100"])
    module._main()
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    return float(re.findall(r"-?\d+\.\d+", last_line)[-1])


@pytest.mark.parametrize("name", ["navigation", "spread", "speaker_listener", "tag"])
def test_the_scripted_controller_beats_random_actions(monkeypatch, capsys, name):
    scripted = demo_return(monkeypatch, capsys, name, "scripted")
    random = demo_return(monkeypatch, capsys, name, "random")
    assert scripted > random + 1.0, (name, scripted, random)


def test_a_demo_too_short_for_an_episode_says_why_its_return_is_nan(monkeypatch, capsys):
    from envs.native import navigation

    monkeypatch.setattr("sys.argv", ["navigation", "--num-envs", "4", "--steps", "5"])
    navigation._main()
    out, err = capsys.readouterr()
    assert "mean episode return nan" in out
    assert "no episode ended in 5 steps (episodes last up to 100)" in err and "--steps 100 or more" in err


def test_running_a_demo_as_a_module_prints_no_runpy_warning_and_names_the_command_it_ran():
    import subprocess
    import sys

    # An option the env refuses: one usage line that names the command as run, not a traceback (and runpy's
    # warning about a module imported before it runs would come first). The demo itself runs in-process above.
    refused = subprocess.run(
        [sys.executable, "-m", "envs.native.navigation", "--n-agents", "0"], capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert refused.stderr.endswith("python -m envs.native.navigation: error: n_agents must be in [1, 256], got 0\n")
    assert "Warning" not in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    "name, option, message",
    [
        ("navigation", "--n-agents=0", "n_agents must be in [1, 256], got 0"),
        ("spread", "--n-agents=65", "n_agents must be in [1, 64], got 65"),
        ("tag", "--n-predators=0", "n_predators must be in [1, 32], got 0"),
        ("speaker_listener", "--n-landmarks=1", "n_landmarks must be in [2, 16], got 1"),
    ],
)
def test_a_demo_option_the_env_refuses_is_one_usage_error(monkeypatch, usage_error, name, option, message):
    """It used to end in the env's ValueError with a traceback."""
    module = importlib.import_module(f"envs.native.{name}")
    monkeypatch.setattr("sys.argv", [name, option, "--steps", "1"])
    with usage_error() as refused:
        module._main()
    assert refused.err.splitlines()[-1].endswith(f"error: {message}")


@pytest.mark.parametrize("option, value", [("--steps", "0"), ("--steps", "-3"), ("--num-envs", "0")])
def test_a_demo_refuses_counts_below_one(monkeypatch, usage_error, option, value):
    """`--steps 0 --gif x.gif` used to fail saving an empty GIF (IndexError), `--steps -3` to run nothing."""
    from envs.native import spread

    monkeypatch.setattr("sys.argv", ["spread", option, value, "--gif", "unused.gif"])
    with usage_error() as refused:
        spread._main()
    assert f"argument {option}: expected a positive int, got" in refused.err


@pytest.mark.parametrize(
    "gif, message",
    [
        ("nodir/env0.gif", "argument --gif: cannot write nodir/env0.gif: the folder nodir does not exist"),
        ("env0.png", "argument --gif: expected a path ending in .gif, got 'env0.png'"),
    ],
)
def test_a_demo_refuses_a_gif_it_cannot_write_before_stepping(monkeypatch, usage_error, tmp_path, gif, message):
    """It used to step the envs, then fail writing the GIF with a FileNotFoundError or Pillow's "unknown file
    extension" traceback."""
    from envs.native import spread

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["spread", "--num-envs", "2", "--steps", "3", "--gif", gif])
    with usage_error() as refused:
        spread._main()
    assert message in refused.err and refused.out == ""
