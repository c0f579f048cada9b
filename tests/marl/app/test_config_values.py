"""Config values: every float option refuses NaN and inf, which slip through range checks such as `x <= 0`;
every field of a config built in Python refuses a value of the wrong type, as the command line does."""

import dataclasses
import re

import numpy as np
import pytest

from envs.native.navigation import NavigationConfig
from marl.algorithms.ppo import PPOConfig
from marl.algorithms.qlearning import QConfig
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

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


@pytest.mark.parametrize(
    "build, message",
    [
        # Cast or split silently before: sizes (6, 4), seeds (1, 2), each character imported as a module.
        (lambda: ModelConfig(hidden="64"), "ModelConfig: hidden='64' has type str, expected tuple[int, ...]"),
        (lambda: ModelConfig(hidden=(64.7, 32)), "ModelConfig: hidden=(64.7, 32) has type tuple, expected tuple[int"),
        (lambda: RunConfig(seeds="12"), "RunConfig: seeds='12' has type str, expected tuple[int, ...]"),
        (lambda: RunConfig(seed=1.5), "RunConfig: seed=1.5 has type float, expected int"),
        (lambda: EnvSettings(imports="my_envs"), "EnvSettings: imports='my_envs' has type str, expected tuple[str"),
        (lambda: PPOConfig(epochs=2.5), "PPOConfig: epochs=2.5 has type float, expected int"),
        # Failed in a range check: "'<=' not supported between instances of 'str' and 'int'".
        (lambda: PPOConfig(lr="1e-3"), "PPOConfig: lr='1e-3' has type str, expected float"),
        (lambda: EnvSettings(num_envs="4"), "EnvSettings: num_envs='4' has type str, expected int"),
        (lambda: NavigationConfig(n_agents="3"), "NavigationConfig: n_agents='3' has type str, expected int"),
        # Failed far away: "'dict' object has no attribute 'num_envs'", "'int' object has no attribute 'get'".
        (lambda: TrainConfig(env={"env": "spread"}), "env must be a marl.config.EnvSettings, got {'env': 'spread'}"),
        (lambda: TrainConfig(group_overrides={"agent": 3}), "group_overrides must be a dict {group: {field: value}}"),
        # Trained QMIX on IQL's and VDN's defaults (QConfig's batch size and updates), not on QMIX's own.
        (lambda: TrainConfig(algo=QConfig(algo="qmix")), "algo='qmix' takes a marl.algorithms.qlearning.QMIXConfig"),
    ],
)
def test_configs_built_in_python_refuse_values_of_the_wrong_type(build, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        build()


def test_configs_built_in_python_take_what_the_command_line_gives():
    # lists for tuples, ranges of seeds, ints for floats, an explicit group map
    assert ModelConfig(hidden=[32, 16]).hidden == (32, 16) and RunConfig(seeds=range(3)).seeds == (0, 1, 2)
    assert PPOConfig(lr=1).lr == 1 and EnvSettings(group_map={"a": ["agent_0"]}).group_map == {"a": ["agent_0"]}


@pytest.mark.parametrize(
    "config, message",
    [
        ({"env": {}}, "got dict: build it with TrainConfig.from_dict"),
        (None, "got NoneType$"),
        (RunConfig(), "got RunConfig$"),
    ],
)
def test_the_trainer_refuses_what_is_not_a_train_config(config, message):
    # was "AttributeError: 'dict' object has no attribute 'run'", from inside the trainer
    from marl.app.trainer import Trainer

    with pytest.raises(TypeError, match=r"^Trainer takes a marl.config.TrainConfig .*" + message):
        Trainer(config)


def test_numpy_values_given_in_python_give_a_checkpoint_that_loads(tmp_path):
    """numpy's float64 and str_ pass as float and str (`lr=np.logspace(-4, -2, 3)[i]`): the run trained, and
    its checkpoint's config held them, so that it did not load back ("... is not a vecmarl checkpoint: it
    holds Python objects other than tensors and plain containers"), neither to resume nor to evaluate."""
    config = TrainConfig(
        env=EnvSettings(env="spread", num_envs=4, env_options={"local_ratio": np.float64(0.25)}),
        algo=PPOConfig(lr=np.float64(1e-3), minibatch_size=32),
        model=ModelConfig(activation=np.str_("relu"), hidden=(8,)),
        run=RunConfig(total_frames=64, rollout_length=8, progress=False, tensorboard=False, device="cpu"),
        group_overrides={"agent": {"gamma": np.float64(0.9)}},
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train_iteration()
    resumed = Trainer.resume(trainer.save())
    saved = resumed.config  # its run section pins the schedules' length (Trainer.resume)
    assert (saved.env, saved.algo, saved.model, saved.group_overrides) == (
        config.env,
        config.algo,
        config.model,
        config.group_overrides,
    )
    assert type(saved.algo.lr) is float and type(saved.model.activation) is str
