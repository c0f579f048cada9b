"""Every float option refuses NaN and inf, which slip through range checks such as `x <= 0`."""

import dataclasses

import pytest

from marl.algorithms.ppo import PPOConfig
from marl.app.cli import main
from marl.config import ModelConfig, TrainConfig

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "config, name, value",
    [
        (PPOConfig, "lr", INF),
        (PPOConfig, "lr", NAN),
        (PPOConfig, "adam_eps", INF),
        (PPOConfig, "gamma", NAN),
        (PPOConfig, "lmbda", NAN),
        (PPOConfig, "clip_eps", NAN),
        (PPOConfig, "entropy_coef", NAN),
        (PPOConfig, "value_coef", INF),
        (PPOConfig, "max_grad_norm", NAN),  # would silently turn gradient clipping off
        (PPOConfig, "max_grad_norm", INF),
        (ModelConfig, "log_std_init", NAN),
        (ModelConfig, "log_std_init", -INF),
    ],
)
def test_non_finite_floats_are_refused(config, name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number, got {value}$"):
        config(**{name: value})


def test_every_float_field_is_checked():
    """A float field added later is covered too: the check is one loop over the fields' types."""
    for config in (PPOConfig, ModelConfig):
        floats = [f.name for f in dataclasses.fields(config) if f.type in (float, "float")]
        assert floats
        for name in floats:
            with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
                config(**{name: NAN})


def test_non_finite_group_overrides_are_refused():
    config = TrainConfig(group_overrides={"agent": {"lr": NAN}})
    with pytest.raises(ValueError, match="lr must be a finite number, got nan"):
        config.for_group("agent")


def test_the_cli_refuses_a_nan_learning_rate(capsys):
    assert main(["train", "--lr", "nan"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("marl train: error: ")
    assert "lr must be a finite number, got nan" in err.splitlines()[0] and "Traceback" not in err


@pytest.mark.parametrize("seed", [-1, 2**63, 10**20])
def test_a_seed_out_of_range_is_one_line_in_train_and_eval(seed, tmp_path, capsys):
    # 10**20 overflowed deep in torch ("Overflow when unpacking long long"); -1 worked on native envs
    # but PettingZoo's refuse it: one range for every env family.
    assert main(["train", "--seed", str(seed), "--log-dir", str(tmp_path), "--no-progress"]) == 2
    assert f"seed must be in [0, 2**63 - 1], got {seed}" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "none.pt"), "--seed", str(seed)]) == 2
    assert f"seed must be in [0, 2**63 - 1], got {seed}" in capsys.readouterr().err


def test_the_largest_seed_is_accepted():
    from marl.config import MAX_SEED, RunConfig

    assert RunConfig(seed=MAX_SEED).seed == MAX_SEED
