"""The `marl` command as a user runs it."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from marl.algorithms.ddpg import DDPGConfig
from marl.algorithms.ppo import PPOConfig
from marl.algorithms.qlearning import QConfig, QMIXConfig
from marl.algorithms.sac import SACConfig
from marl.app.cli import algorithms_text, build_parser, config_from_args, main
from marl.config import SECTIONS, ModelConfig, ModuleFailed, TrainConfig

ROOT = Path(__file__).resolve().parents[3]


def test_train_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for cls in SECTIONS.values():
        for field in dataclasses.fields(cls):
            if field.name != "env_options":
                assert "--" + field.name.replace("_", "-") in text, field.name
    assert "PPO epochs over each rollout" in text and "--env-option" in text and "--resume" in text


def test_train_help_lists_overlap_critic_among_ppos_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    section = text[text.index("algorithm ippo / mappo (PPOConfig):") :].split("\n\n")
    assert "--overlap-critic, --no-overlap-critic" in section[1]  # the section's options, after its description
    assert "ippo / mappo: epochs, minibatch_size, overlap_critic" in " ".join(text.split())  # --group can't set it


def test_train_help_gives_each_algorithm_its_own_defaults_of_shared_options(capsys):
    # `--lr` is listed once, under the first algorithm (MADDPG's 3e-3); MASAC's, MAPPO's and QMIX's sections
    # must say their own defaults where their configs differ from it, and leave out those that are the same.
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out

    def description(title: str) -> str:
        return " ".join(text[text.index(title) :].split("\n\n")[0].split())

    sac, ppo = description("algorithm isac / masac (SACConfig):"), description("algorithm ippo / mappo (PPOConfig):")
    q, qmix = description("algorithm iql / vdn (QConfig):"), description("algorithm qmix (QMIXConfig):")
    assert SACConfig.lr == DDPGConfig.lr and SACConfig.tau == DDPGConfig.tau
    assert f"--lr {SACConfig.lr}" not in sac and f"--tau {SACConfig.tau}" not in sac and "--alpha-init" not in sac
    assert SACConfig.gamma != DDPGConfig.gamma and f"--gamma {SACConfig.gamma}: Discount factor" in sac
    assert f"--updates-per-iteration {SACConfig.updates_per_iteration}:" in sac
    assert f"--batch-size {SACConfig.batch_size}" not in sac  # the same as DDPG's
    assert (
        PPOConfig.lr != DDPGConfig.lr and f"--lr {PPOConfig.lr}:" in ppo and f"--adam-eps {PPOConfig.adam_eps}:" in ppo
    )
    assert QConfig.lr != DDPGConfig.lr and f"--lr {QConfig.lr}" in q and f"--gamma {QConfig.gamma}" in q
    assert QConfig.batch_size == DDPGConfig.batch_size and "--batch-size 256" not in q
    # QMIX's own replay schedule (a subclass of QConfig for one of its names) says its defaults too.
    assert f"--batch-size {QMIXConfig.batch_size}:" in qmix
    assert f"iteration {QMIXConfig.updates_per_iteration}: Optimiser steps" in qmix  # the flag's name may wrap


def test_options_reach_the_config():
    args = build_parser().parse_args(
        [
            "train",
            "--env",
            "navigation",
            "--algo",
            "ippo",
            "--num-envs",
            "8",
            "--hidden",
            "32",
            "16",
            "--env-option",
            "n_agents=5",
            "--env-option",
            "shared_reward=False",
            "--group",
            "agent.lr=0.003",
            "--no-clip-value",
            "--total-frames",
            "1000",
            "--minibatch-size",
            "256",
            "--std",
            "state",
        ]
    )
    config = config_from_args(args)
    assert config.algo.algo == "ippo" and config.env.num_envs == 8 and config.model.hidden == (32, 16)
    assert config.model.std == "state"
    assert config.env.env_options == {"n_agents": 5, "shared_reward": False}
    assert config.group_overrides == {"agent": {"lr": 0.003}} and not config.algo.clip_value
    assert config.for_group("agent")[0].lr == 0.003 and config.algo.lr == 1e-3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--env", "navigaton"], "unknown env 'navigaton'"),
        (["train", "--env-option", "n_agent=3"], "unknown option(s) ['n_agent'] for env 'navigation'"),
        (["train", "--gamma", "1.5"], "gamma must be in [0, 1], got 1.5"),
        (
            ["train", "--num-envs", "4", "--rollout-length", "8", "--minibatch-size", "64"],
            "minibatch_size=64 is larger",
        ),
        (["train", "--group", "agent.lrr=1"], "unknown field(s) ['lrr'] in the overrides for group 'agent'"),
        # A run-wide field is known: it was called "unknown field(s) ['epochs']", as if misspelt.
        (
            ["train", "--group", "agent.epochs=2"],
            "['epochs'] in the overrides for group 'agent': PPOConfig's run-wide field(s) ['epochs', 'minibatch_size',",
        ),
        (["train", "--algo", "ippo", "--overlap-critic"], "overlap_critic needs compile"),
        # A file's path: "no module 'my_algos.py' is found here" (in the folder holding it), or a traceback of a
        # relative import's TypeError.
        (["train", "--imports", "my_algos.py"], "--imports takes module names, as Python's import does, not files"),
        (["train", "--imports", "./algos/my_algos.py"], "not files: pass --imports algos.my_algos (from the folder"),
        (
            ["train", "--group", "agent.std=net"],
            "option std='net' for group 'agent' has type str, expected 'param' | 'state'",
        ),
        # An option of the algorithm one group takes (--group NAME.algo=...): said where it goes.
        (
            ["train", "--env", "speaker_listener", "--algo", "masac", "--group", "speaker.algo=iql"]
            + ["--exploration-eps-init", "0.5"],
            "for group 'speaker' (iql) pass --group speaker.exploration_eps_init=0.5",
        ),
        (["eval", "--checkpoint", "/nonexistent/checkpoint.pt"], "no checkpoint at /nonexistent/checkpoint.pt"),
        (["eval", "--checkpoint", "c.pt", "--num-envs", "0"], "num_envs must be >= 1 (or left out"),
        # Only as many envs as episodes ran: the others were never stepped.
        (["eval", "--checkpoint", "c.pt", "--episodes", "10", "--num-envs", "64"], "--num-envs 64 with --episodes 10"),
        (
            ["eval", "--checkpoint", "c.pt", "--render", "/nonexistent/x.gif"],
            "cannot write /nonexistent/x.gif: the folder /nonexistent does not exist",
        ),
        (["plot", "/nonexistent"], "no metrics.csv in /nonexistent"),
        # meta holds no data: torch's "META device type not an accelerator" with a traceback, after parsing
        (["train", "--device", "meta"], "unknown device 'meta'; expected cpu, cuda, cuda:N or auto"),
        (["eval", "--checkpoint", "c.pt", "--device", "meta"], "unknown device 'meta'; expected cpu, cuda"),
    ],
)
def test_bad_input_is_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_log_dir_under_a_file_is_one_clear_line_before_anything_is_built(tmp_path, capsys, monkeypatch):
    # Was a NotADirectoryError traceback from the logger, once the env and the networks were built.
    (tmp_path / "notes.txt").write_text("")
    monkeypatch.setattr("marl.app.trainer.make_env", lambda *a, **k: pytest.fail("built the env"))
    for log_dir in ("notes.txt", "notes.txt/runs"):
        argv = ["train", "--log-dir", str(tmp_path / log_dir), "--run-name", "r", "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"cannot write the run folder {tmp_path / log_dir / 'r'}: {tmp_path / 'notes.txt'} is a file" in err
        assert "Traceback" not in err


def test_configs_built_in_python_refuse_values_outside_their_choices():
    with pytest.raises(ValueError, match=r"std must be one of \['param', 'state'\], got 'net'"):
        ModelConfig(std="net")
    with pytest.raises(ValueError, match=r"algo must be one of \['mappo', 'ippo'\], got 'ppo'"):
        PPOConfig(algo="ppo")


def test_envs_lists_envs_with_options(capsys):
    main(["envs"])
    out = capsys.readouterr().out
    assert "navigation" in out and "n_agents: int = 3" in out


@pytest.mark.slow
def test_train_eval_plot_end_to_end(tmp_path, capsys):
    # `python -m marl train` as a user runs it; eval, plot and resume through the same `main` in this process
    # (a subprocess each paid the import of torch and tensordict again, most of its time).
    common = ["--log-dir", str(tmp_path), "--run-name", "cli", "--no-progress"]
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "marl",
            "train",
            "--num-envs",
            "16",
            "--rollout-length",
            "8",
            "--minibatch-size",
            "64",
            "--total-frames",
            "256",
            "--env-option",
            "max_steps=10",
            *common,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 0, train.stderr
    assert "mean episode return" in train.stdout and "--render episode.gif" in train.stdout
    checkpoint = tmp_path / "cli" / "checkpoint.pt"
    gif = tmp_path / "team.gif"
    assert main(["eval", "--checkpoint", str(checkpoint), "--episodes", "4", "--render", str(gif)]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out and gif.stat().st_size > 1000
    assert main(["plot", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "learning_curve.png").stat().st_size > 1000
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "384", "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert len((tmp_path / "cli" / "metrics.csv").read_text().splitlines()) == 1 + 3
    assert main(["train", "--resume", str(checkpoint), "--lr", "0.1"]) == 2
    assert "--lr cannot change; only" in capsys.readouterr().err


def test_train_an_env_registered_by_the_users_own_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_envs.py").write_text(
        "import envs\nfrom tests.envs.broken_envs import Counter\n\n"
        "@envs.register('my_counter')\nclass MyCounter(Counter):\n    _render = envs.MultiAgentEnv._render  # no images\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "train",
        "--imports",
        "my_envs",
        "--env",
        "my_counter",
        "--num-envs",
        "8",
        "--rollout-length",
        "8",
        "--minibatch-size",
        "32",
        "--total-frames",
        "64",
        "--log-dir",
        str(tmp_path),
        "--run-name",
        "mine",
        "--no-progress",
        "--no-tensorboard",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mover" in out
    # The env does not render: the summary suggests eval without --render, and --render is a clear error.
    assert "marl eval --checkpoint" in out and "--render" not in out
    gif = tmp_path / "x.gif"
    assert main(["eval", "--checkpoint", str(tmp_path / "mine" / "checkpoint.pt"), "--render", str(gif)]) == 2
    assert "my_counter does not render: run marl eval without --render" in capsys.readouterr().err
    assert not gif.exists()
    assert main(["train", "--imports", "no_such_module", "--env", "my_counter"]) == 2
    assert (
        "--imports no_such_module: no module 'no_such_module' is found here: run marl from the folder that holds "
        "it, or add that folder to PYTHONPATH"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("broken", "options", "says"),
    [
        (
            "PerEnvReward",
            [],
            "marl train: error: perenvreward: _step()'s reward['mover'] (float32 [num_envs, n_agents]) has",
        ),
        ("NanReward", [], "marl train: error: the loss of group 'mover' became nan at iteration 1; stopping"),
        # The loss above does not say where the NaN came from; the env's value checks name the env.
        (
            "NanRewardAtStep3",
            ["--env-option", "check_values=True"],
            "marl train: error: nanrewardatstep3: _step()'s reward for group 'mover' contains NaN or inf in 1 "
            "of 8 envs (env 2)\n",
        ),
    ],
    ids=["env-output", "nan-loss", "nan-reward-checked"],
)
def test_a_run_that_fails_on_what_its_env_returns_ends_in_one_line(
    broken, options, says, tmp_path, monkeypatch, capsys
):
    """An env breaking its contract mid-run, or a loss turning NaN, was a traceback through vecmarl's own
    checks after the trainer's "the run failed" line; the error's message is what the user needs."""
    name = broken.lower()  # a module and env of its own: an imported module stays in sys.modules
    # A subclass is registered: `register` sets the name of the class it registers, which other tests of the
    # same process read in their messages.
    (tmp_path / f"{name}.py").write_text(
        f"import envs\nfrom tests.envs.broken_envs import {broken}\n\nenvs.register('{name}')(type('{broken}', ({broken},), {{}}))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["train", "--imports", name, "--env", name, "--num-envs", "8", "--rollout-length", "8"]
    argv += ["--minibatch-size", "32", "--total-frames", "64", "--log-dir", str(tmp_path), "--no-progress"]
    assert main(argv + ["--no-tensorboard", *options]) == 1
    captured = capsys.readouterr()
    assert "the run failed at iteration 1; no checkpoint was written yet" in captured.out
    assert captured.err.startswith(says) and captured.err.count("\n") == 1, captured.err


@pytest.mark.parametrize(
    ("command", "name", "module", "says"),
    [
        (
            "envs",
            "refused_env",
            "import envs\n\n@envs.register('x')\nclass X:\n    pass\n",
            "register('x'): X must subclass envs.MultiAgentEnv",
        ),
        (
            "envs",
            "refused_env_name",
            "import envs\n\n@envs.register\nclass X(envs.MultiAgentEnv):\n    pass\n",
            "register takes the env's name: write @envs.register('my_env'), got <class 'refused_env_name.X'>",
        ),
        (
            "train",
            "refused_algorithm",
            "from marl import algorithms\n\n@algorithms.register('mine')\nclass Mine:\n    pass\n",
            "register('mine',): Mine must subclass marl.algorithms.Algorithm",
        ),
    ],
    ids=["env-class", "env-name", "algorithm-class"],
)
def test_a_registration_refused_in_an_imports_module_is_one_line(
    command, name, module, says, tmp_path, monkeypatch, capsys
):
    # It was a traceback ending in the registry's raise; a usage error names the module and what to change.
    (tmp_path / f"{name}.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main([command, "--imports", name]) == 2
    assert capsys.readouterr().err == f"marl {command}: error: --imports {name}: {says}\n"


def test_any_other_error_in_an_imports_module_keeps_its_traceback(tmp_path, monkeypatch):
    # The user's own bug: where it is matters more than one tidy line.
    (tmp_path / "buggy_envs.py").write_text("SIZES = {'small': 1}\nSIZE = int('large')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleFailed, match="--imports buggy_envs: importing 'buggy_envs' raised") as raised:
        main(["envs", "--imports", "buggy_envs"])
    cause = raised.value.__cause__
    assert isinstance(cause, ValueError) and "invalid literal for int" in str(cause)
    assert cause.__traceback__ is not None and _last_file(cause.__traceback__) == str(tmp_path / "buggy_envs.py")


def _last_file(traceback) -> str:
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback.tb_frame.f_code.co_filename


def test_a_bug_in_a_runs_imports_module_keeps_its_traceback_in_eval(tmp_path, monkeypatch, capsys):
    # `marl eval` imports a checkpoint's modules while its options are read, where a ValueError is a usage
    # error told in one line: the user's own bug lost where it was.
    module = tmp_path / "later_buggy.py"
    module.write_text(
        "import envs\nfrom tests.envs.broken_envs import Counter\n\n"
        "@envs.register('later_buggy')\nclass LaterBuggy(Counter):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(envs.registry, "_ENVS", dict(envs.registry._ENVS))  # registered for this test only
    argv = ["train", "--imports", "later_buggy", "--env", "later_buggy", "--num-envs", "8", "--rollout-length", "8"]
    argv += ["--minibatch-size", "32", "--total-frames", "64", "--log-dir", str(tmp_path), "--run-name", "run"]
    assert main([*argv, "--no-progress", "--no-tensorboard"]) == 0
    module.write_text("SIZE = int('large')\n")
    monkeypatch.delitem(sys.modules, "later_buggy")
    with pytest.raises(ModuleFailed, match="--imports later_buggy") as raised:
        main(["eval", "--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--episodes", "1"])
    assert _last_file(raised.value.__cause__.__traceback__) == str(module)


def test_plot_overlays_runs_against_time(tmp_path, capsys):
    for name, slope in (("mappo", 1.0), ("ippo", 0.5)):
        (tmp_path / name).mkdir()
        rows = ["frames,time_s,agent/episode_return"] + [f"{i * 100},{i * 0.5},{slope * i}" for i in range(1, 6)]
        (tmp_path / name / "metrics.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "both.png"
    assert main(["plot", str(tmp_path / "mappo"), str(tmp_path / "ippo"), "--x", "time", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and f"wrote {out}" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.csv").write_text("frames,time_s,agent/episode_return\n")
    assert main(["plot", str(tmp_path / "mappo"), str(tmp_path / "empty")]) == 2
    assert "metrics.csv has no rows yet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "says"),
    [("train", "<env>-<algo>-seed<seed>-<time>."), ("eval", "default: min(episodes, 256)")],
)
def test_help_shows_no_empty_defaults(command, says, capsys):
    # An option without a value says in its help what leaving it out does; "(default: None)" would not.
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: )" not in out
    assert says in " ".join(out.split())


def test_plot_and_eval_help_say_what_they_take(capsys):
    # plot's said only "run folders (holding metrics.csv)": a population's folder, which it plots, holds none.
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert "a population's (--seeds: the mean over its members with a 95% CI band" in " ".join(
        capsys.readouterr().out.split()
    )
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "cpu, cuda, cuda:N, or auto" in " ".join(capsys.readouterr().out.split())


def test_the_console_script_imports_modules_of_the_current_folder(tmp_path):
    # `python -m marl` puts the current folder on sys.path; the `marl` script must too, or the README's
    # `marl train --imports my_envs` fails with "No module named 'my_envs'".
    script = Path(sys.executable).with_name("marl")
    if not script.exists():
        pytest.skip("the marl console script is not installed in this environment")
    (tmp_path / "my_envs.py").write_text(
        "import envs\nfrom tests.envs.broken_envs import Counter\n\n"
        "@envs.register('my_counter')\nclass MyCounter(Counter):\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # for `tests.envs`, as the module imports it
    listed = subprocess.run(
        [str(script), "envs", "--imports", "my_envs"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    assert "my_counter" in listed.stdout


@pytest.mark.parametrize(
    ("argv", "buffered"),
    [
        (["envs"], False),  # a print finds the pipe closed, inside the command
        (["plot", "--help"], True),  # the help is still buffered when argparse exits: the flush finds it closed
    ],
)
def test_a_reader_that_stops_early_ends_marl_quietly(argv, buffered):
    # `marl envs | head -2`: head exits after two lines, and marl's next write fails with EPIPE. A pipe whose
    # read end is closed before marl starts is that case without a race.
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env |= {"PYTHONPATH": str(ROOT)} | ({} if buffered else {"PYTHONUNBUFFERED": "1"})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "marl", *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")  # 128 + SIGPIPE, as a shell reports for `yes | head`


def test_ctrl_c_ends_with_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("marl.app.cli.cmd_envs", interrupted)
    assert main(["envs"]) == 130
    assert capsys.readouterr().err == "marl envs: interrupted\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--gamma", "1.5"], "invalid option for algo options: gamma must be in [0, 1], got 1.5"),
        (["train", "--env-option", "n_agents=0"], "invalid option for env 'navigation': n_agents must be in [1, "),
        # A negative number is a value, with an exponent too (argparse took `-1e-3` for an option: "--lr: expected
        # one argument"), with or without "=".
        (["train", "--lr", "-1e-3"], "invalid option for algo options: lr must be > 0, got -0.001"),
        (["train", "--lr=-1e-3"], "invalid option for algo options: lr must be > 0, got -0.001"),
        (["train", "--lr", "-0.001"], "invalid option for algo options: lr must be > 0, got -0.001"),
    ],
)
def test_a_value_out_of_range_is_exactly_one_line(argv, message, capsys):
    # The check names the option and its range; a listing of every other option would bury it.
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err


def test_options_that_may_be_negative_take_any_form_of_negative_number():
    for value in ("-1", "-0.5", "-.5", "-5e-1", "-5E-1", "-5e+0", "-1.5e1"):
        args = build_parser().parse_args(["train", "--env", "navigation", "--log-std-init", value])
        assert config_from_args(args).model.log_std_init == float(value)


def test_the_startup_line_names_what_each_groups_critic_sees():
    groups = ["speaker", "listener"]
    assert algorithms_text(TrainConfig(), groups) == "MAPPO"
    assert algorithms_text(TrainConfig(algo=PPOConfig(algo="ippo")), groups) == "IPPO"
    assert algorithms_text(TrainConfig(algo=PPOConfig(critic_scope="agent")), groups) == "IPPO"
    overridden = TrainConfig(group_overrides={"listener": {"critic_scope": "agent"}})
    assert algorithms_text(overridden, groups) == "MAPPO (speaker), IPPO (listener)"


def test_the_startup_line_names_each_groups_algorithm_of_one_module():
    # `--algo masac --group speaker.algo=isac`: one SAC module trains both groups, the speaker as ISAC.
    groups = ["speaker", "listener"]
    sac = TrainConfig(algo=SACConfig(algo="masac"), group_overrides={"speaker": {"algo": "isac"}})
    assert algorithms_text(sac, groups) == "ISAC (speaker), MASAC (listener)"
    ddpg = TrainConfig(algo=DDPGConfig(algo="iddpg"), group_overrides={"listener": {"algo": "maddpg"}})
    assert algorithms_text(ddpg, groups) == "IDDPG (speaker), MADDPG (listener)"
    assert algorithms_text(TrainConfig(algo=SACConfig(algo="isac")), groups) == "ISAC"


@pytest.mark.parametrize(("algo", "title"), [("iql", "iql / vdn (QConfig)"), ("qmix", "qmix (QMIXConfig)")])
def test_train_help_does_not_say_q_learning_takes_critic_options(algo, title, capsys):
    # The IQL/VDN and QMIX sections said "It also takes --critic-scope, ... --shared-value", options they refuse.
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    section = " ".join(text[text.index(f"algorithm {title}:") :].split("\n\n")[0].split())
    assert "It also takes --adam-eps" in section and "--gamma" in section
    for flag, value in (("--critic-scope", "agent"), ("--shared-value", None)):
        assert flag not in section, section
        # What the help no longer claims: the run refuses it, before building anything.
        assert main(["train", "--algo", algo, "--env", "spread", flag, *([value] if value else [])]) == 2
        assert "leave them at their defaults" in capsys.readouterr().err
    assert ("--mixing-embed-dim" in section) == (algo == "qmix")


@pytest.mark.parametrize("algo", ["iql", "qmix"])
def test_another_algorithms_option_lists_only_options_q_learning_takes(algo, capsys):
    # The list after "its options:" named --critic-scope and --shared-value, which Q-learning then refuses.
    assert main(["train", "--algo", algo, "--env", "spread", "--clip-eps", "0.1"]) == 2
    err = capsys.readouterr().err
    listed = err.split("its options: ")[1].split(";")[0].split(", ")
    assert "--gamma" in listed and "--double-q" in listed, listed
    assert "--critic-scope" not in listed and "--shared-value" not in listed, listed
    assert ("--mixing-embed-dim" in listed) == (algo == "qmix"), listed
