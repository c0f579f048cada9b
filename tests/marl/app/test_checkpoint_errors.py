"""Loading a file that is not a vecmarl checkpoint says so in one clear error, not torch's."""

import pytest
import torch

from marl.algorithms.ppo import PPOConfig
from marl.app.checkpoint import load_checkpoint
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

NOT_A_CHECKPOINT = "is not a vecmarl checkpoint (a checkpoint.pt written by marl train): "


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    """The bytes of a checkpoint that `marl train` writes, from an untrained tiny run."""
    run_dir = tmp_path_factory.mktemp("real")
    config = TrainConfig(
        env=EnvSettings(env="navigation", num_envs=4),
        algo=PPOConfig(minibatch_size=32, epochs=1),
        model=ModelConfig(hidden=(8,)),
        run=RunConfig(total_frames=32, rollout_length=8, progress=False, tensorboard=False),
    )
    path = Trainer(config, run_dir=run_dir).save()
    assert load_checkpoint(path)["config"] == config.to_dict()
    return path.read_bytes()


def _text(path):
    path.write_text("not a checkpoint\n")


def _csv(path):
    path.write_text("iteration,frames,episode_return\n1,256,-3.5\n")


def _tensor(path):
    torch.save(torch.zeros(3), path)


def _other_dict(path):
    torch.save({"policy": {"weight": torch.zeros(2)}}, path)


def _empty(path):
    path.write_bytes(b"")


@pytest.mark.parametrize(
    "write, reason",
    [
        (_text, "it is not a file written by torch.save"),
        (_csv, "it is not a file written by torch.save"),
        (_tensor, "it holds a Tensor, not a dict"),
        (_other_dict, "it is a dict without the key(s) ['config', 'iteration'"),
        (_empty, "the file is empty"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_a_value_error(tmp_path, write, reason):
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(ValueError) as error:
        load_checkpoint(path)
    assert str(error.value).startswith(f"{path} {NOT_A_CHECKPOINT}")
    assert reason in str(error.value)


def test_a_truncated_checkpoint_is_a_value_error(tmp_path, real_checkpoint):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(real_checkpoint[: len(real_checkpoint) // 2])
    with pytest.raises(ValueError, match="is truncated or corrupted"):
        load_checkpoint(path)


def test_a_python_object_in_the_file_is_refused_without_suggesting_weights_only_false(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"config": object()}, path)
    with pytest.raises(ValueError, match="holds Python objects other than tensors") as error:
        load_checkpoint(path)
    assert "weights_only" not in str(error.value)


def test_a_missing_checkpoint_stays_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {tmp_path / 'nope.pt'}"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # a run folder given for its checkpoint
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is a run folder; pass its checkpoint, {tmp_path}/"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("command", ["train --resume", "eval --checkpoint"])
@pytest.mark.parametrize("write", [_text, _csv])
def test_the_cli_reports_a_bad_checkpoint_in_one_line(tmp_path, capsys, command, write):
    path = tmp_path / "metrics.csv"
    write(path)
    assert main([*command.split(), str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"marl {command.split()[0]}: error: {path} {NOT_A_CHECKPOINT}it is not a file written by torch.save"
    )
