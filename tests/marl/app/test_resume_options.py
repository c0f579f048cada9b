"""What `marl train --resume` does with a new --total-frames (the schedules keep the run's length unless
--schedule-frames stretches them, and say so), a total already reached, and options that would have no effect."""

from __future__ import annotations

import pytest

from marl.algorithms.ddpg import DDPGConfig
from marl.algorithms.ppo import PPOConfig
from marl.algorithms.qlearning import QConfig, QMIXConfig
from marl.algorithms.sac import SACConfig
from marl.app.checkpoint import load_checkpoint, save_checkpoint
from marl.app.cli import main
from marl.app.logger import read_rows
from marl.app.trainer import NothingToTrain, Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

# VDN on spread: 16 envs x 32 steps = 512 frames per iteration; epsilon 0.8 -> 0.01 over the first third.
VDN = ["--algo", "vdn", "--env", "spread", "--num-envs", "16", "--rollout-length", "32", "--hidden", "16"]
VDN += ["--batch-size", "64", "--updates-per-iteration", "1", "--buffer-size", "4096", "--no-progress"]
VDN += ["--no-tensorboard"]


def epsilon(frames: int, span: int) -> float:
    """QConfig's default schedule, written out: 0.8 moved linearly to 0.01 over span / 3 frames."""
    return 0.8 + (0.01 - 0.8) * min(frames / (span / 3), 1.0)


def trained(tmp_path, capsys, total: int):
    assert main(["train", *VDN, "--log-dir", str(tmp_path), "--run-name", "run", "--total-frames", str(total)]) == 0
    capsys.readouterr()
    return tmp_path / "run" / "checkpoint.pt"


def epsilons(trainer) -> list[float]:
    return [float(lr.policy.epsilon) for lr in trainer.algorithm.learners.values()]


def test_a_longer_resumed_run_keeps_its_schedules_annealed_and_says_so(tmp_path, capsys):
    # The run ended at 5,120 frames with epsilon at its end value; resumed to 20,000 frames it used to anneal
    # over the new total, raising epsilon back to 0.19.
    checkpoint = trained(tmp_path, capsys, 5120)
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "5632", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "schedules: they keep the run's length, 5,120 frames, not --total-frames 5,632" in out
    assert "agent epsilon 0.01)" in out and f"agent epsilon {epsilon(5120, 5632):.3g} now" in out
    resumed = Trainer.resume(checkpoint, total_frames=6144)
    assert resumed.config.run.schedule_span() == 5120 and resumed.frames == 5632
    resumed.train_iteration()
    assert epsilons(resumed) == [pytest.approx(epsilon(5632, 5120))] == [pytest.approx(0.01)]


def test_a_resume_to_the_length_its_schedules_were_set_to_says_nothing_of_them(tmp_path, capsys):
    # It said "they keep the run's length, 1,024 frames, not --total-frames 1,024 ... --schedule-frames 1,024
    # would fit them to it": the length they already have
    argv = ["train", *VDN, "--log-dir", str(tmp_path), "--run-name", "run", "--schedule-frames", "1024"]
    assert main([*argv, "--total-frames", "512"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run" / "checkpoint.pt"), "--total-frames", "1024"]) == 0
    assert "schedules:" not in capsys.readouterr().out


def test_schedule_frames_stretches_the_schedules_on_resume(tmp_path, capsys):
    checkpoint = trained(tmp_path, capsys, 1024)
    command = ["train", "--resume", str(checkpoint), "--total-frames", "1536", "--schedule-frames", "8192"]
    assert main([*command, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        f"schedules: stretched from 1,024 to --schedule-frames 8,192 frames (agent epsilon 0.01 -> "
        f"{epsilon(1024, 8192):.3g}, annealing to 0.01)" in out
    )
    resumed = Trainer.resume(checkpoint, total_frames=2048)  # the stretched length is the run's now
    resumed.train_iteration()
    assert epsilons(resumed) == [pytest.approx(epsilon(1536, 8192))]


def test_a_resume_to_the_same_total_says_nothing_of_the_schedules(tmp_path, capsys):
    config = TrainConfig(
        env=EnvSettings(env="spread", num_envs=16),
        algo=QConfig(algo="vdn", batch_size=64, updates_per_iteration=1, buffer_size=4096),
        model=ModelConfig(hidden=(16,)),
        run=RunConfig(total_frames=4096, rollout_length=32, progress=False, tensorboard=False, checkpoint_every=1),
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train_iteration()
    trainer.save()
    assert main(["train", "--resume", str(trainer.checkpoint_path), "--checkpoint-every", "100"]) == 0
    assert "schedules" not in capsys.readouterr().out


def test_a_checkpoint_of_an_earlier_version_resumes_with_its_schedules_over_its_total(tmp_path, capsys):
    checkpoint = trained(tmp_path, capsys, 1024)
    state = load_checkpoint(checkpoint)
    del state["config"]["run"]["schedule_frames"]  # as an earlier vecmarl wrote it
    # Options an earlier version accepted where they had no effect (no GRU, no mixer): loaded at their defaults.
    state["config"]["algo"].update(chunk_length=8, burn_in=2, mixing_embed_dim=64)
    state["config"]["group_overrides"] = {"agent": {"mixing_embed_dim": 16}}
    save_checkpoint(checkpoint, state)
    resumed = Trainer.resume(checkpoint, total_frames=4096)
    algo, _ = resumed.config.for_group("agent")
    assert (algo.chunk_length, algo.burn_in, algo.mixing_embed_dim) == (16, 0, 32)
    assert resumed.config.group_overrides == {"agent": {}}
    resumed.train_iteration()
    assert epsilons(resumed) == [pytest.approx(0.01)]


def test_a_total_already_reached_is_one_line(tmp_path, capsys):
    checkpoint = trained(tmp_path, capsys, 1024)
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "1000"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"nothing to train: {checkpoint.parent} has trained 1,024 frames (iteration 2), --total-frames is 1,000; "
        "pass a larger --total-frames to train on"
    ]
    assert not captured.err
    with pytest.raises(NothingToTrain):
        Trainer.resume(checkpoint, frames_left=True)
    assert Trainer.resume(checkpoint).train() == []  # in Python, a finished run resumes to be looked at


@pytest.mark.parametrize("field, value", [("rollout_length", 16), ("seed", 3), ("log_dir", "elsewhere")])
def test_trainer_resume_refuses_what_marl_train_resume_refuses(tmp_path, capsys, field, value):
    # In Python these were taken: rollout_length=16 resumed with other iterations than the run's (inexact), and
    # log_dir went into the config while the run went on writing to its own folder.
    checkpoint = trained(tmp_path, capsys, 1024)
    refused = rf"^Trainer.resume keeps the run's configuration: \['{field}'\] cannot change; only \[.*'total_frames'"
    with pytest.raises(ValueError, match=refused):
        Trainer.resume(checkpoint, total_frames=2048, **{field: value})
    assert Trainer.resume(checkpoint, total_frames=2048, checkpoint_every=5).config.run.checkpoint_every == 5


@pytest.mark.parametrize("locked", ["the folder", "metrics.csv"])
def test_a_read_only_run_is_refused_in_one_line_before_training(tmp_path, capsys, read_only, locked):
    # Was a PermissionError traceback at the first iteration's log, or after training, at its checkpoint.
    checkpoint = trained(tmp_path, capsys, 1024)
    run, log = checkpoint.parent, checkpoint.parent / "metrics.csv"
    logged = log.read_bytes()
    read_only(run if locked == "the folder" else log)
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "2048"]) == 2
    captured = capsys.readouterr()
    said = f"the folder {run}" if locked == "the folder" else str(log)
    assert captured.err == f"marl train: error: cannot resume the run in {run}: {said} is not writable\n"
    assert log.read_bytes() == logged
    # A finished run, resumed in Python to be looked at, writes nothing: it is not refused.
    assert Trainer.resume(checkpoint).train() == []


def test_a_read_only_tensorboard_folder_is_refused_in_one_line_unless_tensorboard_is_off(tmp_path, capsys, read_only):
    # Was a PermissionError traceback from the TensorBoard writer, after the env and the algorithm were built.
    with_tensorboard = [arg for arg in VDN if arg != "--no-tensorboard"]
    command = ["train", *with_tensorboard, "--log-dir", str(tmp_path), "--run-name", "run", "--total-frames", "1024"]
    assert main(command) == 0
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    run, events = checkpoint.parent, checkpoint.parent / "tensorboard"
    read_only(events)
    capsys.readouterr()
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "2048"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"marl train: error: cannot resume the run in {run}: the folder {events} is not writable\n"
    assert [row["iteration"] for row in read_rows(run / "metrics.csv")] == [1, 2]
    # Without TensorBoard the run writes nothing there: it resumes.
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "2048", "--no-tensorboard"]) == 0
    assert [row["iteration"] for row in read_rows(run / "metrics.csv")] == [1, 2, 3, 4]


def test_a_linear_lr_is_not_trained_past_its_end(tmp_path):
    run = RunConfig(total_frames=4096, schedule_frames=1024)
    with pytest.raises(ValueError, match=r"--lr-schedule linear anneals lr to 0 over --schedule-frames 1,024"):
        TrainConfig(algo=PPOConfig(lr_schedule="linear"), run=run)
    with pytest.raises(ValueError, match=r"pass --schedule-frames 4,096"):
        TrainConfig(group_overrides={"agent": {"lr_schedule": "linear"}}, run=run)
    with pytest.raises(ValueError, match=r"--schedule-frames 1024: it applies to annealed values only"):
        TrainConfig(run=run)  # a constant lr does not anneal: nothing would


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--burn-in", "4"], "--burn-in 4: it applies to recurrent networks only"),
        (["--chunk-length", "8", "--burn-in", "2"], "--chunk-length 8, --burn-in 2: they apply to recurrent"),
        (["--algo", "ippo", "--chunk-length", "8"], "--chunk-length 8: it applies to recurrent networks only"),
        (["--gru-hidden", "32"], "--gru-hidden 32: it applies to recurrent networks only"),
        (["--gru-nets", "both", "--gru-hidden", "32"], "--gru-hidden 32, --gru-nets both: they apply to recurrent"),
        (["--group", "agent.gru_nets=critic"], "--group agent.gru_nets=critic: group 'agent' has MLPs"),
        (["--algo", "iql", "--priority-alpha", "0.9"], "--priority-alpha 0.9: it applies to prioritized replay only"),
        (
            ["--algo", "masac", "--priority-beta", "0.5", "--priority-reduce", "mean"],
            "--priority-beta 0.5, --priority-r",
        ),
        (["--algo", "iql", "--target-update-every", "50"], "--target-update-every 50: it applies to --target-update h"),
        (
            ["--algo", "iql", "--target-update", "hard", "--group", "agent.target_update=polyak", "--group"]
            + ["agent.target_update_every=5"],
            "--group agent.target_update_every=5: in group 'agent' these targets move by tau every step (polyak), and "
            "it applies to --target-update hard only: pass --group agent.target_update=hard too",
        ),
        # Hard copies move the targets by no tau: --tau changed nothing.
        (
            ["--algo", "iql", "--target-update", "hard", "--tau", "0.1"],
            "--tau 0.1: it applies to target networks that move by it every step (--target-update polyak); the "
            "targets are copied every 200 steps (--target-update hard): pass --target-update polyak too",
        ),
        (
            ["--algo", "iql", "--target-update", "hard", "--group", "agent.tau=0.1"],
            "--group agent.tau=0.1: in group 'agent' the targets are copied every 200 steps (--target-update hard), "
            "and it applies to target networks that move by it every step (--target-update polyak): pass --group "
            "agent.target_update=polyak too",
        ),
        (
            "--algo masac --group agent.algo=iql --group agent.target_update=hard --group agent.tau=0.1".split(),
            "--group agent.tau=0.1: in group 'agent' the targets are copied every 200 steps",
        ),
        # Without annealing the exploration is its end value from the start: its start changed nothing.
        (
            ["--algo", "iql", "--exploration-anneal", "0", "--exploration-eps-init", "0.5"],
            "--exploration-eps-init 0.5: it applies to the start of epsilon's annealing only; epsilon is its end value "
            "from the start (--exploration-anneal 0): pass an --exploration-anneal above 0 too, or leave it out",
        ),
        (
            "--algo iddpg --group agent.exploration_anneal=0 --group agent.exploration_sigma_init=0.5".split(),
            "--group agent.exploration_sigma_init=0.5: in group 'agent' sigma is its end value from the start "
            "(--exploration-anneal 0), and it applies to the start of sigma's annealing only: pass --group "
            "agent.exploration_anneal above 0 too",
        ),
        # SAC's target entropy of the actions no group has: it changed nothing.
        (
            ["--algo", "masac", "--target-entropy-scale", "2"],
            "--target-entropy-scale 2.0: spread's SAC groups (agent) have discrete actions, and it applies to the "
            "target entropy of continuous (Box) actions only: leave it out",
        ),
        (
            ["--algo", "isac", "--env-option", "continuous_actions=True", "--discrete-target-entropy", "0.5"],
            "--discrete-target-entropy 0.5: spread's SAC groups (agent) have continuous (Box) actions, and it",
        ),
        (
            ["--algo", "masac", "--group", "agent.target_entropy_scale=2"],
            "--group agent.target_entropy_scale=2: group 'agent' has Discrete actions, and it applies to the target",
        ),
        # Nothing anneals: --schedule-frames changed nothing.
        (
            ["--schedule-frames", "1000"],
            "--schedule-frames 1000: it applies to annealed values only, and --algo mappo anneals none with these "
            "options: pass --lr-schedule linear too, or leave it out",
        ),
        (["--algo", "masac", "--schedule-frames", "1000"], "--algo masac anneals none with these options: pass --prio"),
        (
            ["--algo", "iql", "--exploration-anneal", "0", "--schedule-frames", "1000"],
            "--algo iql anneals none with these options: pass --exploration-anneal above 0 with --exploration-eps-init",
        ),
        (
            "--algo iddpg --exploration-sigma-init 0.1 --exploration-sigma-end 0.1 --schedule-frames 9".split(),
            "--algo iddpg anneals none with these options: pass --exploration-anneal above 0 with --exploration-sigma",
        ),
        # The runs of --seeds take the list's seeds: --seed changed nothing (their checkpoints were the same).
        (["--seeds", "0", "1", "--seed", "5"], "--seed 5: --seeds 0 1 names each run's seed, and --seed would have"),
        (["--wandb-project", "mine"], "--wandb-project mine: it applies to Weights & Biases logging only: pass --w"),
        (["--no-wandb", "--wandb-mode", "offline", "--wandb-name", "x"], "--wandb-mode offline, --wandb-name x: they"),
        (["--save-buffer"], "--save-buffer: it applies to algorithms that learn from a replay buffer; --algo mappo"),
        (
            ["--algo", "isac", "--no-learn-alpha", "--discrete-target-entropy", "0.5"],
            "--discrete-target-entropy 0.5: it applies to the tuning of alpha only; here alpha stays alpha_init: pass --l",
        ),
        (
            ["--algo", "iql", "--log-std-init", "-1"],
            "--log-std-init -1.0: --algo iql's policies have no std to set (those of",
        ),
        (
            ["--algo", "maddpg", "--std", "state"],
            "--std state: --algo maddpg's policies have no std to set (those of --algo ",
        ),
        (
            ["--algo", "masac", "--group", "a.algo=iql", "--group", "a.std=state"],
            "--group a.std=state: the iql policy of group 'a' has no std",
        ),
        (
            ["--log-std-init", "1", "--minibatch-size", "64"],
            "--log-std-init 1.0: spread's groups (agent) have discrete actions, which have no",
        ),
        (["--algo", "masac", "--tau", "0"], "tau must be in (0, 1], got 0.0"),
        (["--algo", "vdn", "--mixing-embed-dim", "64"], "mixing_embed_dim is an option of qmix"),
        (["--algo", "iql", "--group", "agent.mixing_embed_dim=64"], "invalid option for group 'agent': mixing_"),
        (
            [
                "--algo",
                "qmix",
                "--batch-size",
                "256",
                "--group",
                "agent.algo=vdn",
                "--group",
                "agent.mixing_embed_dim=64",
            ],
            "vdn has no mixing network",
        ),
    ],
)
def test_options_without_effect_are_refused_in_one_line(tmp_path, argv, message, capsys):
    base = ["train", "--env", "spread", "--num-envs", "8", "--total-frames", "1", "--log-dir", str(tmp_path)]
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_their_defaults_and_their_right_uses_are_taken():
    assert TrainConfig(algo=PPOConfig(chunk_length=16, burn_in=0)).algo.chunk_length == 16  # the defaults, given
    gru = ModelConfig(model="gru")
    assert TrainConfig(algo=QConfig(algo="vdn", chunk_length=8, burn_in=2), model=gru).algo.burn_in == 2
    qmix = TrainConfig(algo=QMIXConfig(mixing_embed_dim=64), group_overrides={"b": {"algo": "vdn"}})
    assert qmix.for_group("a")[0].mixing_embed_dim == 64
    assert qmix.for_group("b")[0].mixing_embed_dim == 32  # a VDN group of a QMIX run has no mixer to size
    vdn = TrainConfig(algo=QConfig(algo="vdn"), group_overrides={"b": {"algo": "qmix", "mixing_embed_dim": 16}})
    assert vdn.for_group("b")[0].mixing_embed_dim == 16
    gru_group = TrainConfig(model=ModelConfig(gru_hidden=32), group_overrides={"b": {"model": "gru"}})
    assert gru_group.for_group("b")[1].gru_hidden == 32  # the run's GRU size, for its one recurrent group


def test_replay_and_target_options_are_taken_in_their_mode_and_saved_ones_without_it_load():
    assert QConfig(prioritized=True, priority_alpha=0.9, priority_reduce="mean").priority_alpha == 0.9
    # An earlier version took them without --prioritized, where they had no effect: its checkpoints still load.
    saved = TrainConfig(algo=QConfig(algo="vdn")).to_dict()
    saved["algo"]["priority_beta"] = 0.9
    assert TrainConfig.from_dict(saved).algo.priority_beta == QConfig.priority_beta
    ppo = TrainConfig(run=RunConfig(total_frames=99)).to_dict()
    ppo["run"]["save_buffer"] = True  # and --save-buffer with PPO, which has no buffer
    assert TrainConfig.from_dict(ppo).run == RunConfig(total_frames=99)
    sac = TrainConfig(algo=SACConfig(learn_alpha=False)).to_dict()
    sac["algo"]["target_entropy_scale"] = 2.0  # and the target entropy with a fixed alpha
    assert TrainConfig.from_dict(sac).algo == SACConfig(learn_alpha=False)
    ddpg = TrainConfig(algo=DDPGConfig()).to_dict()
    ddpg["model"]["std"] = "state"  # and --std with DDPG's deterministic policies
    assert TrainConfig.from_dict(ddpg).model == ModelConfig()
    TrainConfig(model=ModelConfig(std="state"), algo=DDPGConfig(), group_overrides={"b": {"algo": "masac"}})  # b's
    saved["algo"]["target_update_every"] = 50  # and target_update_every with Polyak targets
    assert TrainConfig.from_dict(saved).algo.target_update_every == QConfig.target_update_every
    assert QConfig(target_update="hard", target_update_every=50).target_update_every == 50


def test_tau_and_schedule_frames_are_taken_where_used_and_saved_ones_without_a_use_load():
    hard = QConfig(algo="iql", target_update="hard", tau=0.1)
    polyak_group = {"b": {"target_update": "polyak"}}  # b moves its targets by the run's tau
    assert TrainConfig(algo=hard, group_overrides=polyak_group).for_group("b")[0].tau == 0.1
    assert TrainConfig(algo=QConfig(algo="iql"), group_overrides={"b": {"tau": 0.3}}).for_group("b")[0].tau == 0.3
    # The run's target_update_every where a group copies its targets: it was refused for the run's Polyak ones.
    every = QConfig(algo="iql", target_update_every=50)
    hard_group = TrainConfig(algo=every, group_overrides={"b": {"target_update": "hard"}})
    assert hard_group.for_group("b")[0].target_update_every == 50
    sac = TrainConfig(algo=SACConfig(tau=0.1), group_overrides={"b": {"algo": "iql", "target_update": "hard"}})
    assert sac.algo.tau == 0.1  # the SAC groups' tau
    span = RunConfig(total_frames=99, schedule_frames=4096)
    assert TrainConfig(algo=SACConfig(prioritized=True), run=span).annealed() == ("beta",)
    assert TrainConfig(algo=QConfig(algo="iql"), run=span).annealed() == ("epsilon",)
    linear_group = TrainConfig(run=span, group_overrides={"b": {"lr_schedule": "linear"}})
    assert linear_group.annealed() == ("lr",)
    # An earlier version took them where they had no effect (and pinned --schedule-frames on every resume):
    # its checkpoints still load, without them.
    saved = TrainConfig(algo=QConfig(algo="iql", target_update="hard")).to_dict()
    saved["algo"]["tau"], saved["group_overrides"] = 0.1, {"b": {"tau": 0.3}, "c": {"target_update": "polyak"}}
    config = TrainConfig.from_dict(saved)
    assert config.algo.tau == 0.1 and config.group_overrides == {"b": {}, "c": {"target_update": "polyak"}}
    del saved["group_overrides"]["c"]
    assert TrainConfig.from_dict(saved).algo.tau == QConfig.tau
    ddpg = TrainConfig(algo=DDPGConfig(exploration_anneal=0.0)).to_dict()
    ddpg["algo"]["exploration_sigma_init"] = 0.5
    assert TrainConfig.from_dict(ddpg).algo == DDPGConfig(exploration_anneal=0.0)
    annealing_group = {"b": {"exploration_anneal": 0.5}}  # b anneals from the run's start
    assert TrainConfig(
        algo=DDPGConfig(exploration_anneal=0.0, exploration_sigma_init=0.5), group_overrides=annealing_group
    )
    ppo = TrainConfig().to_dict()
    ppo["run"]["schedule_frames"] = 4096
    assert TrainConfig.from_dict(ppo).run.schedule_frames == 0
    linear = TrainConfig(algo=PPOConfig(lr_schedule="linear"), run=RunConfig(total_frames=99, schedule_frames=4096))
    assert TrainConfig.from_dict(linear.to_dict()).run.schedule_frames == 4096


def test_a_run_with_nothing_annealed_resumes_to_a_longer_total(tmp_path, capsys):
    # The resume pinned --schedule-frames to the run's length, which a run with nothing annealed now refuses.
    argv = ["train", "--env", "spread", "--num-envs", "8", "--rollout-length", "16", "--minibatch-size", "64"]
    argv += ["--log-dir", str(tmp_path), "--run-name", "run", "--no-progress", "--no-tensorboard"]
    assert main([*argv, "--total-frames", "128"]) == 0
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "256", "--no-progress"]) == 0
    assert [row["iteration"] for row in read_rows(tmp_path / "run" / "metrics.csv")] == [1, 2]
    assert load_checkpoint(checkpoint)["config"]["run"]["schedule_frames"] == 0


def test_a_saved_mlp_run_with_gru_options_loads_at_their_defaults():
    # An earlier version took --gru-hidden with MLPs, where it had no effect: its checkpoints still load.
    saved = TrainConfig().to_dict()
    saved["model"]["gru_hidden"], saved["group_overrides"] = 32, {"agent": {"gru_nets": "both"}}
    config = TrainConfig.from_dict(saved)
    assert config.model.gru_hidden == 64 and config.group_overrides == {"agent": {}}


def test_a_saved_population_with_a_seed_loads_without_it():
    # An earlier version took --seed beside --seeds, where it had no effect: its checkpoints still load.
    saved = TrainConfig(run=RunConfig(seeds=(3, 4))).to_dict()
    saved["run"]["seed"] = 5
    run = TrainConfig.from_dict(saved).run
    assert run.seed == RunConfig.seed and run.member_seeds() == (3, 4)
    assert RunConfig(seed=5, num_seeds=2).member_seeds() == (5, 6)  # --seed with --num-seeds is its first


def test_wandb_options_saved_without_wandb_load_and_a_resume_without_wandb_drops_them(tmp_path, capsys):
    checkpoint = trained(tmp_path, capsys, 512)
    state = load_checkpoint(checkpoint)
    state["config"]["run"]["wandb_entity"] = "me"  # an earlier version took it without --wandb: no effect
    save_checkpoint(checkpoint, state)
    assert TrainConfig.from_dict(state["config"]).run.wandb_entity == ""
    state["config"]["run"].update(wandb=True, wandb_project="mine")  # a W&B run, resumed without W&B
    save_checkpoint(checkpoint, state)
    run = Trainer.resume(checkpoint, total_frames=1024, wandb=False).config.run
    assert (run.wandb, run.wandb_project, run.wandb_entity) == (False, "vecmarl", "")


def test_a_checkpoint_copied_into_another_runs_folder_is_refused_there_and_resumes_alone(tmp_path, capsys):
    # The resume wrote next to its checkpoint: it dropped run b's rows after a's iteration 2, appended a's, and
    # overwrote b's checkpoint.pt with a's run.
    for name, frames in (("a", "1024"), ("b", "2048")):
        argv = ["train", *VDN, "--log-dir", str(tmp_path), "--run-name", name, "--total-frames", frames]
        assert main(argv) == 0
    capsys.readouterr()
    a, b, alone = tmp_path / "a", tmp_path / "b", tmp_path / "alone"
    before = {name: (b / name).read_bytes() for name in ("metrics.csv", "checkpoint.pt")}
    (b / "from_a.pt").write_bytes((a / "checkpoint.pt").read_bytes())
    assert main(["train", "--resume", str(b / "from_a.pt"), "--total-frames", "2048"]) == 2
    err = capsys.readouterr().err
    assert f"{b / 'from_a.pt'} is not the checkpoint of the run logged in {b / 'metrics.csv'}" in err
    assert len(err.splitlines()) == 1
    assert {name: (b / name).read_bytes() for name in before} == before
    alone.mkdir()  # alone in a folder of its own, it trains on there, a new log from its iteration on
    (alone / "checkpoint.pt").write_bytes((a / "checkpoint.pt").read_bytes())
    assert main(["train", "--resume", str(alone / "checkpoint.pt"), "--total-frames", "2048"]) == 0
    assert [row["iteration"] for row in read_rows(alone / "metrics.csv")] == [3, 4]


def test_a_saved_std_of_discrete_actions_resumes(tmp_path, capsys):
    # An earlier version took --log-std-init with discrete actions only (no effect): such a run still resumes.
    argv = ["train", "--env", "spread", "--num-envs", "8", "--rollout-length", "8", "--minibatch-size", "32"]
    argv += ["--hidden", "8", "--no-progress", "--no-tensorboard", "--log-dir", str(tmp_path), "--run-name", "run"]
    assert main([*argv, "--total-frames", "64"]) == 0
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    state = load_checkpoint(checkpoint)
    state["config"]["model"]["log_std_init"] = 1.0
    save_checkpoint(checkpoint, state)
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "128"]) == 0


def test_a_checkpoint_kept_beside_the_runs_own_is_not_resumed_over_it(tmp_path, capsys):
    # Resumed from a copy kept at iteration 1, the run overwrote its checkpoint.pt of iteration 2.
    checkpoint = trained(tmp_path, capsys, 512)
    kept = checkpoint.with_name("iteration1.pt")
    kept.write_bytes(checkpoint.read_bytes())
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "1024"]) == 0
    latest = checkpoint.read_bytes()
    assert main(["train", "--resume", str(kept), "--total-frames", "2048"]) == 2
    err = capsys.readouterr().err
    assert f"a resume from {kept} writes its checkpoints to {checkpoint}, which holds another checkpoint" in err
    assert checkpoint.read_bytes() == latest and len(err.splitlines()) == 1


def test_a_resume_with_other_options_names_them_as_flags(tmp_path, capsys):
    # It said "only ['checkpoint_every', ...] can change, got ['env_options', 'lr']": field names, not flags.
    checkpoint = trained(tmp_path, capsys, 512)
    assert main(["train", "--resume", str(checkpoint), "--lr", "0.1", "--env-option", "n_agents=4"]) == 2
    err = capsys.readouterr().err
    assert "keeps the run's configuration: --env-option, --lr cannot change; only --checkpoint-every," in err


def test_help_says_what_resume_does_with_the_schedules(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the schedules (epsilon, sigma, beta) keep the run's length" in text
    # A linear lr does not keep the run's length: resuming past it is refused (lr would stay 0).
    assert "linear is refused without it: lr would stay 0" in text
    assert "A resumed run keeps the length its schedules had" in text
    assert "makes them linear maps of their inputs" in text  # --hidden: none is a legitimate choice


def test_a_swept_lr_schedule_is_said_as_a_scale_of_each_runs_lr(tmp_path, capsys):
    # Each run of `--sweep lr=...` has its own lr: the schedule line gives the scale all of them share.
    argv = ["--num-envs", "8", "--rollout-length", "8", "--minibatch-size", "32", "--hidden", "8"]
    argv += ["--lr-schedule", "linear", "--seeds", "0", "--sweep", "lr=1e-3,2e-3", "--no-progress", "--no-tensorboard"]
    assert main(["train", *argv, "--total-frames", "128", "--log-dir", str(tmp_path), "--run-name", "run"]) == 0
    capsys.readouterr()
    resume = ["train", "--resume", str(tmp_path / "run" / "checkpoint.pt"), "--total-frames", "192"]
    assert main([*resume, "--schedule-frames", "256", "--no-progress"]) == 0
    says = "schedules: stretched from 128 to --schedule-frames 256 frames (agent lr scale 0 -> 0.5, annealing to 0)"
    assert says in capsys.readouterr().out


@pytest.mark.parametrize(
    "line, damage, message",
    [
        # A cell that is not a number: in the iteration column, which the resume reads to drop rows, or another.
        (2, lambda text: "abc" + text[1:], "line 3: iteration is 'abc', not a number"),
        (1, lambda text: text.replace(",512,", ",5x2,", 1), "line 2: frames is '5x2', not a number"),
        # A row cut short before other rows (a crash cuts only the last line, without its newline: below).
        (2, lambda text: text[:10], "line 3: 3 values, expected"),
    ],
    ids=["iteration", "frames", "cut-short"],
)
def test_a_damaged_metrics_csv_is_named_with_its_line_in_one_line(tmp_path, capsys, line, damage, message):
    checkpoint = trained(tmp_path, capsys, 1536)
    log = checkpoint.parent / "metrics.csv"
    lines = log.read_text().splitlines()
    lines[line] = damage(lines[line])
    log.write_text("\n".join(lines) + "\n")
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "2048", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{log}, {message}" in err and len(err.splitlines()) == 1
    assert log.read_text() == "\n".join(lines) + "\n", "the damaged log is left as it was"


def test_a_last_row_cut_short_by_a_crash_is_dropped_on_resume(tmp_path, capsys):
    """A row whose write was cut (a kill or a full disk mid-write) ends the log without its newline; it is of
    an iteration after the checkpoint. The resume refused it as damaged, and had it been kept, the next row
    would have been appended onto it."""
    checkpoint = trained(tmp_path, capsys, 1536)
    log = checkpoint.parent / "metrics.csv"
    whole = log.read_text()
    log.write_text(whole + whole.splitlines()[-1][:10])
    assert [row["iteration"] for row in read_rows(log)] == [1.0, 2.0, 3.0]
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "2048", "--no-progress"]) == 0
    lines = log.read_text().splitlines()
    assert "\n".join(lines[:4]) + "\n" == whole and len(lines) == 5
    assert [row["iteration"] for row in read_rows(log)] == [1.0, 2.0, 3.0, 4.0]


def test_the_runs_own_command_with_resume_added_trains_on(tmp_path, capsys):
    # It was refused ("--algo, --batch-size, ... cannot change") though none of them had changed.
    checkpoint = trained(tmp_path, capsys, 512)
    own = [*VDN, "--log-dir", str(tmp_path), "--run-name", "run"]
    own += ["--group", "agent.lr=0.0003"]  # the run's lr, but as an override, which the run had none of
    assert main(["train", *own, "--resume", str(checkpoint), "--total-frames", "1024"]) == 2
    assert "keeps the run's configuration: --group cannot change" in capsys.readouterr().err
    assert main(["train", *own[:-2], "--resume", str(checkpoint), "--total-frames", "1024"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert len(read_rows(checkpoint.parent / "metrics.csv")) == 2
    assert main(["train", *own[:-2], "--hidden", "32", "--resume", str(checkpoint), "--total-frames", "2048"]) == 2
    assert "keeps the run's configuration: --hidden cannot change" in capsys.readouterr().err
