"""Problems found by running torchrun, resume and --compile as a user (none needs a GPU or 2 ranks)."""

from __future__ import annotations

import warnings

import pytest
import torch

import envs.compile
from envs.specs import Box, GroupSpec
from marl.app import distributed, seeds
from marl.app.cli import build_parser, config_from_args
from marl.app.trainer import Trainer
from marl.core.rollout import EpisodeStats
from tests.marl.app.test_training import small_config


def test_resumed_episode_stats_live_on_the_collectors_device():
    """Checkpoints load on the CPU (`load_checkpoint`, and `gather_checkpoint` sends every rank's state
    there): a run resumed on CUDA kept its running returns on the CPU and failed at its first step,
    adding CUDA rewards to them. `meta` stands in for CUDA here."""
    groups = {"agent": GroupSpec(["a0", "a1"], Box((4,)), Box((2,), -1.0, 1.0))}
    stats = EpisodeStats(groups, num_envs=3, device=torch.device("meta"))
    stats.load_state_dict({"running": {"agent": torch.ones(3, 2)}, "length": torch.full((3,), 5.0)})
    assert stats.running["agent"].device.type == "meta"
    assert stats.length.device.type == "meta"
    stats.update({"agent": torch.zeros(3, 2, device="meta")}, torch.zeros(3, dtype=torch.bool, device="meta"))


def test_an_error_of_the_function_itself_is_not_blamed_on_torch_compile(monkeypatch):
    """An env raising under --compile (here a bad input) printed "torch.compile could not compile ...;
    running eagerly instead" before the same error came again from the eager run."""
    monkeypatch.setattr(envs.compile, "_warned", False)

    def step(x):
        if x.shape[0] == 3:
            raise ValueError("the env's own error")
        return x + 1

    compiled = envs.compile.maybe_compile(step, True, torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback warning would fail the test
        with pytest.raises(ValueError, match="the env's own error") as raised:
            compiled(torch.zeros(3))
    assert raised.value.__context__ is None  # not chained to a compiler traceback


def test_a_compiler_failure_still_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(envs.compile, "_warned", False)

    def broken_compile(fn, **_):
        def call(*args, **kwargs):
            raise RuntimeError("no working C++ compiler")

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    calls = []

    def step(x):
        calls.append(1)
        return x + 1

    compiled = envs.compile.maybe_compile(step, True, torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match="could not compile .*no working C.. compiler.*running eagerly"):
        assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    assert len(calls) == 2


def test_more_ranks_per_node_than_cuda_devices_is_one_clear_error(monkeypatch):
    """`torchrun --nproc-per-node 2` on a node with one GPU: rank 1 asked torch for cuda:1 and died with
    a traceback ("invalid device ordinal") instead of saying what to change."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail(f"set_device({device}) was called"))
    with pytest.raises(ValueError, match=r"LOCAL_RANK=1, but this node has 1 CUDA device.*--nproc-per-node 1"):
        distributed.setup(torch.device("cuda"), {})


def test_resume_hints_name_nodes_and_processes_per_node(monkeypatch):
    """A job of 2 nodes x 4 ranks was told to resume with `torchrun --nproc-per-node 8`, which starts 8
    processes on one node: the hints now say `--nnodes 2 --nproc-per-node 4` (torchrun's
    LOCAL_WORLD_SIZE, saved in the checkpoint)."""
    assert distributed.launcher(1, 1) == "marl"
    assert distributed.launcher(4, 4) == "torchrun --nproc-per-node 4 -m marl"
    assert distributed.launcher(8, 4).startswith("torchrun --nnodes 2 --nproc-per-node 4 ")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    world = distributed.DistributedWorld(rank=0, size=8, device=torch.device("cpu"))
    assert world.local_size == 4
    saved = {"world_size": 8, "local_world_size": 4}
    with pytest.raises(ValueError, match="torchrun --nnodes 2 --nproc-per-node 4 .*-m marl train --resume"):
        distributed.World().own_checkpoint(saved)
    with pytest.raises(ValueError, match=r"this job has 2; resume it on 8 rank\(s\) \(e.g. torchrun --nnodes 2"):
        distributed.DistributedWorld(rank=0, size=2, device=torch.device("cpu")).own_checkpoint(saved)


def test_a_checkpoint_resumed_on_other_ranks_hints_the_whole_command():
    """A checkpoint of 2 ranks resumed on 3 was told "e.g. torchrun --nproc-per-node 2 -m marl", a command
    that stops before `train --resume` (the one-process hint says it)."""
    world = distributed.DistributedWorld(rank=0, size=3, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"\(e.g. torchrun --nproc-per-node 2 -m marl train --resume \.\.\.\)"):
        world.own_checkpoint({"world_size": 2, "local_world_size": 2, "iteration": 3, "frames": 96})


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--sweep", "lr=1e-4,1e-3"], "--sweep"),
        (["--num-seeds", "2"], "--num-seeds"),
        (["--seeds", "0", "1"], "--seeds"),
    ],
)
def test_several_runs_under_torchrun_are_refused_naming_the_option_given(options, named):
    """`torchrun ... marl train --sweep lr=1e-4,1e-3` (one seed) was refused with "several seeds (--seeds,
    --num-seeds) train in one process", naming options the user had not passed."""
    config = config_from_args(build_parser().parse_args(["train", *options]))
    world = distributed.DistributedWorld(rank=0, size=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=rf"^{named} trains 2 runs in one process.*without torchrun") as refused:
        seeds.check_population(config, world)
    others = {"--sweep", "--num-seeds", "--seeds"} - {named}
    assert not [flag for flag in others if flag in str(refused.value)]  # "--seeds" is not in "--num-seeds"


def test_nothing_to_broadcast_or_average_needs_no_collective():
    """An algorithm without parameters (or a step in which none has a gradient) failed under torchrun in
    `torch.cat([])` ("expected a non-empty list of Tensors"); every rank has the same nothing, so no rank
    joins a collective (none is set up here: one would fail)."""
    world = distributed.DistributedWorld(rank=0, size=2, device=torch.device("cpu"))
    world.broadcast_parameters([])
    world.average_gradients([torch.zeros(3, requires_grad=True)])  # no gradient yet


def test_a_one_process_checkpoint_under_torchrun_hints_the_command_in_one_process():
    """`torchrun --nproc-per-node 2 -m marl train --resume` of a run of one process was told to "resume it
    on 1 rank(s) (e.g. marl) so every rank's envs continue": now the command itself."""
    world = distributed.DistributedWorld(rank=0, size=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"written by one process.* resume it in one process: marl train --resume"):
        world.own_checkpoint({"world_size": 1, "iteration": 3, "frames": 96})


def test_only_rank_0_says_that_the_env_cannot_save_its_state(tmp_path, capsys):
    """Resuming a run of an env without state (VMAS, PettingZoo) under torchrun printed "this env cannot
    save its state" once per rank. A rank other than 0 is stood in for by its `is_main`."""
    trainer = Trainer(small_config(tmp_path), run_dir=tmp_path / "run")
    state = {**trainer.state_dict(), "env": None}  # what an env without state_dict() saves
    trainer.world.is_main = False
    trainer.load_state_dict(state)
    assert capsys.readouterr().out == ""
    trainer.world.is_main = True
    trainer.load_state_dict(state)
    assert "this env cannot save its state" in capsys.readouterr().out
