"""Every command in the bash blocks of the README and of the benchmark page (`marl/bench/README.md`) is one
a user can type: each `marl ...`, `torchrun ... -m marl ...` and `python -m MODULE ...` line parses with
that program's own argument parser; the cheap ones (`marl envs`, `--help`, the env demos) run for real;
tutorials and extras named exist."""

import dataclasses
import os
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from marl.app.cli import build_parser, config_from_args
from marl.app.cli import main as marl_main
from marl.app.trainer import Trainer
from tests.commands import run_module_main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text() + (ROOT / "marl" / "bench" / "README.md").read_text()
CHEAP_MODULES = {"envs.native.navigation", "envs.native.spread", "envs.native.tag", "envs.native.speaker_listener"}


def readme_commands() -> list[list[str]]:
    """The README's bash commands, `\\`-continued lines joined, comments dropped, split at `&&`."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words:
                    commands.append(words)
    return commands


def with_env_vars_dropped(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    return words


COMMANDS = [with_env_vars_dropped(c) for c in readme_commands()]


def marl_argv(words: list[str]) -> list[str]:
    if words[0] == "marl":
        return words[1:]
    if words[:3] == ["python", "-m", "marl"]:
        return words[3:]
    return words[words.index("-m") + 2 :]  # torchrun [its options] -m marl ARGS


def test_the_readme_has_commands_of_every_kind():
    kinds = {"python -m" if c[:2] == ["python", "-m"] else c[0] for c in COMMANDS}
    assert {"pip", "marl", "torchrun", "python -m", "python"} <= kinds, kinds


# `marl envs` and `--help` run for real below; `--imports my_envs` names the user's own module, so only
# its options are checked here.
@pytest.mark.parametrize(
    "words",
    [c for c in COMMANDS if c[0] in ("marl", "torchrun") and marl_argv(c) != ["envs"] and "--help" not in c],
    ids=shlex.join,
)
def test_marl_commands_parse(words, parse_only, capsys, monkeypatch):
    # `--imports my_envs` names the reader's own module, imported before parsing: an empty one stands in.
    monkeypatch.setitem(sys.modules, "my_envs", types.ModuleType("my_envs"))
    with pytest.raises(parse_only):
        marl_main(marl_argv(words))


TRAIN_COMMANDS = [
    c
    for c in COMMANDS
    if c[0] in ("marl", "torchrun") and "train" in c and not {"--resume", "--imports", "--help"} & set(c)
]


@pytest.mark.parametrize("words", TRAIN_COMMANDS, ids=shlex.join)
def test_train_commands_build_a_trainer(words, tmp_path):
    """Options, env names, env options and group overrides are all valid: the trainer builds."""
    config = config_from_args(build_parser().parse_args(marl_argv(words)))
    run = dataclasses.replace(config.run, log_dir=str(tmp_path), device="cpu", tensorboard=False, progress=False)
    Trainer(dataclasses.replace(config, run=run))


@pytest.mark.parametrize("words", [c for c in COMMANDS if c[:2] == ["python", "-m"]], ids=shlex.join)
def test_python_module_commands_parse(words, parse_only, monkeypatch, capsys):
    if words[2] == "pytest":
        assert (ROOT / words[3] if len(words) > 3 and not words[3].startswith("-") else ROOT / "tests").exists()
        return
    if words[2] == "marl":
        with pytest.raises(parse_only):
            marl_main(marl_argv(words))
        return
    with pytest.raises(parse_only):
        run_module_main(words, monkeypatch)


@pytest.mark.parametrize(
    "words",
    [
        c
        for c in COMMANDS
        if (c[:2] == ["marl", "envs"] and "--imports" not in c) or "--help" in c or c[2:3] and c[2] in CHEAP_MODULES
    ],
    ids=shlex.join,
)
def test_cheap_commands_run(words, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # where a command writes files (a GIF)
    if words[0] == "marl":
        try:
            assert marl_main(words[1:]) == 0
        except SystemExit as exit:  # --help
            assert exit.code == 0
    else:
        try:
            run_module_main(words, monkeypatch)
        except SystemExit as exit:
            assert exit.code == 0
    assert capsys.readouterr().out.strip()


def test_tutorials_and_extras_named_exist():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for words in COMMANDS:
        if words[0] == "python" and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), words
        if words[:2] == ["pip", "install"]:
            for spec in words[2:]:
                for extra in re.findall(r"\[([\w,]+)\]", spec):
                    assert set(extra.split(",")) <= extras, (spec, extras)


def test_scripts_named_exist_and_run():
    scripts = {words[0] for words in COMMANDS if "/" in words[0]}
    assert ".gpu/report.sh" in scripts, scripts
    for script in scripts:
        assert (ROOT / script).is_file() and os.access(ROOT / script, os.X_OK), script
