"""`marl`: train, evaluate, plot and list envs from the command line.

    marl train                                   # MAPPO on navigation with the defaults
    marl train --env navigation --algo ippo --num-envs 512 --env-option n_agents=5
    marl eval --checkpoint runs/RUN/checkpoint.pt --episodes 100 --render team.gif
    marl plot runs/RUN
    marl bench --quick
    marl envs

The train options are generated from the config dataclasses in `marl.config`; their docstrings are
the help text.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import os
import re
import signal
import sys
import threading
import typing
from typing import Any

from envs import options as _options
from envs.registry import RegistrationError
from marl import algorithms
from marl.config import RESUMABLE, SECTIONS, TrainConfig, field_names, group_fields, import_modules

# Options that are not plain fields on the command line.
SPECIAL = {"env_options", "group_overrides"}
SPECIAL_FLAGS = {"env_options": "--env-option", "group_overrides": "--group"}


def _parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), _parse_value(value)


def _add_field(group: argparse._ArgumentGroup, cls: type, field: dataclasses.Field, doc: str) -> None:
    tp = _options.field_types(cls)[field.name]
    flag = "--" + field.name.replace("_", "-")
    default = _default(field)
    shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
    help_text = f"{doc} (default: {shown})" if shows_default(default) else doc
    kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": help_text}
    if tp is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
    elif typing.get_origin(tp) is typing.Literal:
        group.add_argument(flag, choices=typing.get_args(tp), **kwargs)
    elif typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        group.add_argument(flag, type=item, nargs="+", metavar=item.__name__.upper(), **kwargs)
    else:
        group.add_argument(flag, type=tp, metavar=tp.__name__.upper(), **kwargs)


def shows_default(default: Any) -> bool:
    """Whether --help shows an option's default: not an empty one (None, "" or ()), where the help says what
    leaving the option out does and "(default: None)" would only repeat it less clearly."""
    return default is not None and default != "" and default != ()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default where `shows_default`."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return super()._get_help_string(action) if shows_default(action.default) else action.help


def _train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train every agent group of an env (--algo: " + ", ".join(algorithms.names()) + ")",
        description="Train every agent group of an env with the algorithm --algo names, on the device, "
        "batched over num_envs envs. Writes metrics.csv, checkpoint.pt and (with tensorboard installed) "
        "TensorBoard events to LOG_DIR/RUN_NAME; `marl plot` draws the curves. Each algorithm's options "
        "are listed in its own section; an algorithm registered in a module of your own appears here with "
        "`--imports MODULE`.",
        formatter_class=HelpFormatter,
    )
    titles = {"env": "environment", "model": "networks", "run": "run"}
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(titles[section])
        _add_fields(group, cls, {})
        if section == "env":
            group.add_argument(
                "--env-option",
                dest="env_options",
                action="append",
                type=_key_value,
                default=[],
                metavar="KEY=VALUE",
                help="an option of the env, e.g. n_agents=5 (repeatable; see `marl envs`); check_values=True "
                "also checks every step's actions, rewards and observations for NaN/inf (a host sync per step: "
                "for debugging)",
            )
    group = parser.add_argument_group("algorithm")
    group.add_argument(
        "--algo",
        choices=algorithms.names(),
        default=argparse.SUPPRESS,
        help=f"the algorithm (default: {algorithms.DEFAULT}); its options follow, in its section",
    )
    added = {"algo": None}  # each option's (default, help) where --help lists it
    for config, names in _algorithm_configs().items():
        # Not the other algorithms' options it refuses other values of (its `not_shared`: IQL's critic_scope).
        shared = sorted(field_names(config) & added.keys() - {"algo", *config.not_shared})
        also = f" It also takes {', '.join(_flag(f) for f in shared)} (above)." if shared else ""
        section = parser.add_argument_group(
            f"algorithm {' / '.join(names)} ({config.__name__})",
            _first_line(config) + also + _own_defaults(config, added),
        )
        _add_fields(section, config, added)
    parser.add_argument(
        "--group",
        dest="group_overrides",
        action="append",
        type=_key_value,
        default=[],
        metavar="GROUP.FIELD=VALUE",
        help="override a field of the algorithm's options or of the networks for one group, e.g. "
        "speaker.lr=1e-3 (repeatable); not the algorithm's run-wide fields ("
        + "; ".join(
            f"{' / '.join(names)}: {', '.join(c.run_wide)}" for c, names in _algorithm_configs().items() if c.run_wide
        )
        + ")",
    )
    parser.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue the run saved in this checkpoint, with its options; only "
        + ", ".join(_flag(name) for name in sorted(RESUMABLE))
        + " may change (others may be given at the run's own values). With a larger --total-frames it trains "
        "on from where it stopped; the schedules (epsilon, sigma, beta) keep the run's length, so that annealed "
        "values stay annealed, unless --schedule-frames stretches them (PPO's --lr-schedule linear is refused without it: lr would stay 0)",
    )
    return parser


def _add_fields(group: argparse._ArgumentGroup, cls: type, added: dict[str, tuple]) -> None:
    """Add `cls`'s fields not in `added` (and not SPECIAL) to `group`, and to `added` with their
    `(default, help)`."""
    docs = _options.field_docs(cls)
    for field in dataclasses.fields(cls):
        if field.name not in SPECIAL and field.name not in added:
            _add_field(group, cls, field, docs.get(field.name, ""))
            added[field.name] = (_default(field), docs.get(field.name, ""))


def _default(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _own_defaults(config: type, added: dict[str, tuple]) -> str:
    """The options `config` shares with an algorithm listed above but with another default (and help):
    its section says them, as `--lr` is listed once, with the first algorithm's default."""
    docs = _options.field_docs(config)
    own = []
    for field in dataclasses.fields(config):
        if field.name == "algo" or field.name not in added or _default(field) == added[field.name][0]:
            continue
        doc = docs.get(field.name, "")
        own.append(
            f"{_flag(field.name)} {_default(field)}" + (f": {doc.rstrip('.')}" if doc != added[field.name][1] else "")
        )
    return f" Its own defaults of those: {'; '.join(own)}." if own else ""


def _algorithm_configs() -> dict[type, list[str]]:
    """Each registered algorithm's config class, with the names it is registered under."""
    configs: dict[type, list[str]] = {}
    for name in algorithms.names():
        configs.setdefault(algorithms.config_class(name), []).append(name)
    return configs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _first_line(cls: type) -> str:
    """The first line of a config's docstring (a dataclass without one has its signature as __doc__)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(cls.__name__ + "(") else doc.strip().split("\n")[0]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = vars(args)
    sections = {}
    for section, cls in SECTIONS.items():
        values = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given and f.name not in SPECIAL}
        if section == "env":
            values["env_options"] = dict(given.get("env_options", []))
        sections[section] = _options.build(cls, values, f"{section} options")
    algo = given.get("algo", algorithms.DEFAULT)
    config = algorithms.config_class(algo)
    own = field_names(config)
    overrides = _group_overrides(given.get("group_overrides", []))
    # Another algorithm's option (never a model option: registration refuses such names).
    others = {name for cls in _algorithm_configs() for name in field_names(cls) - own if name in given}
    if others:
        flags = ", ".join(_flag(name) for name in sorted(others))
        raise ValueError(
            f"{flags} {'is not an option' if len(others) == 1 else 'are not options'} of --algo {algo}; "
            f"its options: {', '.join(_flag(n) for n in sorted(own - {'algo', *config.not_shared}))}"
            + _group_hint(sorted(others), given, overrides)
        )
    values = {name: given[name] for name in own if name in given}
    sections["algo"] = _options.build(config, {**values, "algo": algo}, "algo options")
    return TrainConfig(**sections, group_overrides=overrides)


def _group_overrides(pairs: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """`--group GROUP.FIELD=VALUE` pairs as {group: {field: value}}."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in pairs:
        if "." not in key:
            raise ValueError(f"--group expects GROUP.FIELD=VALUE, got {key}={value}")
        group, field = key.split(".", 1)
        overrides.setdefault(group, {})[field] = value
    return overrides


def _group_hint(names: list[str], given: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> str:
    """Where the options `names` of another algorithm go when a group takes that algorithm (`--group
    speaker.algo=iql` with `--exploration-eps-init` in a masac run): that group's `--group` overrides."""
    hints = []
    for group, fields in overrides.items():
        other = fields.get("algo")
        if other in algorithms.names():
            own = [name for name in names if name in group_fields(algorithms.config_class(other))]
            if own:
                flags = " ".join(f"--group {group}.{name}={given[name]}" for name in own)
                hints.append(f"for group {group!r} ({other}) pass {flags}")
    return "".join(f"; {hint}" for hint in hints)


class UsageError(Exception):
    """Bad input on the command line: reported in one line, without a traceback."""


@contextlib.contextmanager
def usage_errors():
    """Turn the errors that bad options raise while setting up (unknown env, option or value, missing
    file or module) into a `UsageError`; errors during training itself keep their traceback."""
    try:
        yield
    except (ValueError, TypeError, KeyError, FileNotFoundError, ImportError, MemoryError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise UsageError(str(message)) from error


class Terminated(KeyboardInterrupt):
    """SIGTERM: what a scheduler sends at a job's time limit, and torchrun to the ranks left when one
    fails. Raised as an interruption, so the trainer says where its last checkpoint is, as on Ctrl-C."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Raise `Terminated` on SIGTERM inside the block (from the main thread only, where signal
    handlers run); the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _frames_text(total_frames: int, trainer) -> str:
    """The frames a run trains for: whole iterations, so `total_frames` rounded up (and said so)."""
    text = f"{trainer.frames_to_run:,} frames" + (" per run" if len(trainer.members) > 1 else "")
    if trainer.frames_to_run != total_frames:
        text += f" (--total-frames {total_frames:,} rounded up to whole iterations of {trainer.frames_per_iteration:,})"
    return text


def cmd_train(args: argparse.Namespace) -> int:
    from envs.base import EnvOutputError
    from marl.app import seeds
    from marl.app.checkpoint import CheckpointWriteError
    from marl.app.logger import LogWriteError
    from marl.app.summary import print_summary
    from marl.app.trainer import NonFiniteLossError, NothingToTrain
    from marl.app.wandb_logging import WandbStartError

    try:
        with usage_errors():
            trainer = _make_trainer(args)
    except NothingToTrain as done:  # one line, not a plan to train followed by "nothing to train"
        if os.environ.get("RANK", "0") == "0":  # raised before torchrun's ranks join: rank 0 says it
            print(done)
        return 0
    config, world = trainer.config, trainer.world
    if trainer.saved_run is not None and world.is_main:
        print(f"resuming {trainer.run_dir} at iteration {trainer.iteration} ({trainer.frames:,} frames)")
        schedules = schedules_text(trainer)
        if schedules:
            print(schedules)
    envs_text = f"{config.env.num_envs} envs" + (f" on each of {world.size} ranks" if world.size > 1 else "")
    if len(trainer.members) > 1:
        envs_text = f"{len(trainer.members)} runs x {envs_text} ({seeds.members_text(trainer.members)})"
    if world.is_main:
        groups = ", ".join(f"{g}: {_count(s.n_agents, 'agent')}" for g, s in trainer.env.groups.items())
        print(
            f"training {config.env.env} ({groups}) "
            f"with {algorithms_text(config, trainer.env.groups)} on {trainer.device}, {envs_text}, "
            f"{_frames_text(config.run.total_frames, trainer)}; "
            f"logging to {trainer.run_dir}"
        )
        if config.run.eval_every:
            per = " per run" if len(trainer.members) > 1 else (" per rank" if world.size > 1 else "")
            print(
                f"evaluating the policies' mode every {_count(config.run.eval_every, 'iteration')} and after the "
                f"last, on {_count(config.run.eval_episodes, 'episode')}{per}"
            )
    with sigterm_as_interrupt():
        try:
            rows = trainer.train()
        except WandbStartError as error:  # raised before the first iteration: bad setup, said in one line
            raise UsageError(str(error)) from error
        except (NonFiniteLossError, EnvOutputError, CheckpointWriteError, LogWriteError) as error:
            # Their message says what broke and where (group, loss term, env method, or the disk): a traceback
            # would only show vecmarl's own checks. The trainer has said where the last checkpoint is.
            # Under torchrun the others are raised alike on every rank (or on rank 0 only) and said once; an
            # env's error is its rank's own (its envs), said by that rank, which may not be rank 0.
            if isinstance(error, EnvOutputError) and world.size > 1:
                print(f"marl train: error: rank {world.rank} of {world.size}: {error}", file=sys.stderr)
            elif world.is_main:
                print(f"marl train: error: {error}", file=sys.stderr)
            return 1
    rows = trainer.logged_rows + rows if rows else rows  # resumed: the summary is of the whole run
    if world.is_main and len(trainer.members) > 1:
        seeds.print_summary(trainer, rows)
    elif world.is_main:
        print_summary(trainer, rows)
    world.close()
    return 0


def _at_saved_values(args: argparse.Namespace, names: set[str]) -> set[str]:
    """Of the options `names` given with `--resume`, those at the run's own values: the run's command repeated
    with --resume added changes nothing (it was refused, naming options that had not changed)."""
    from marl.app.checkpoint import load_checkpoint

    saved = TrainConfig.from_dict(load_checkpoint(args.resume)["config"])
    values = {"group_overrides": saved.group_overrides}
    for section in (saved.algo, saved.env, saved.model, saved.run):
        values.update({f.name: getattr(section, f.name) for f in dataclasses.fields(section)})
    given = {name: getattr(args, name) for name in names}
    if "env_options" in given:
        given["env_options"] = dict(given["env_options"])
    if "group_overrides" in given:
        given["group_overrides"] = _group_overrides(given["group_overrides"])
    return {
        name
        for name, value in given.items()
        if name in values and _lists_as_tuples(value) == _lists_as_tuples(values[name])
    }


def _lists_as_tuples(value: Any) -> Any:
    """Lists as tuples, at any depth (argparse gives `--hidden 64 64` as a list, a config holds a tuple)."""
    if isinstance(value, dict):
        return {k: _lists_as_tuples(v) for k, v in value.items()}
    return tuple(_lists_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def algorithms_text(config, groups) -> str:
    """What trains `groups`, as the algorithm names it (PPO: MAPPO or IPPO per group's critic scope)."""
    return algorithms.label(config, groups)


def _make_trainer(args: argparse.Namespace):
    from marl.app.trainer import Trainer

    if args.resume:
        changed = {k for k in vars(args) if k not in {"command", "resume", "env_options", "group_overrides", "func"}}
        changed |= {k for k in ("env_options", "group_overrides") if getattr(args, k)}
        if changed - RESUMABLE:
            changed -= _at_saved_values(args, changed - RESUMABLE)
        not_allowed = sorted(changed - RESUMABLE)
        if not_allowed:
            raise ValueError(
                f"marl train --resume keeps the run's configuration: "
                f"{', '.join(SPECIAL_FLAGS.get(name, _flag(name)) for name in not_allowed)} cannot "
                f"change; only {', '.join(map(_flag, sorted(RESUMABLE)))} can"
            )
        return Trainer.resume(args.resume, frames_left=True, **{k: getattr(args, k) for k in changed})
    return Trainer(config_from_args(args))


def schedules_text(trainer) -> str | None:
    """What a resumed run's new --total-frames (or --schedule-frames) does to its schedules, with their
    values now; None when neither changed or the run has no schedules."""
    saved, run, frames = trainer.saved_run, trainer.config.run, trainer.frames
    before, span = saved.schedule_span(), run.schedule_span()
    # Unchanged, or a run that set --schedule-frames to the total it now trains to: they already fit it.
    if span == before and run.total_frames in (saved.total_frames, span):
        return None
    now = trainer.algorithm.schedules(frames, span)
    if not now:
        return None
    end = trainer.algorithm.schedules(span, span)

    def values(at: dict[str, float], was: dict[str, float] | None = None) -> str:
        return ", ".join(
            f"{name} "
            + (f"{was[name]:.3g} -> " if was and f"{was[name]:.3g}" != f"{v:.3g}" else "")
            + f"{v:.3g}"
            + (f", annealing to {end[name]:.3g}" if f"{end[name]:.3g}" != f"{v:.3g}" else "")
            for name, v in at.items()
        )

    if span == before:
        stretched = trainer.algorithm.schedules(frames, run.total_frames)
        return (
            f"schedules: they keep the run's length, {span:,} frames, not --total-frames "
            f"{run.total_frames:,} ({values(now)}); --schedule-frames {run.total_frames:,} would fit them to it ("
            + ", ".join(f"{name} {v:.3g} now" for name, v in stretched.items())
            + ")"
        )
    was = trainer.algorithm.schedules(frames, before)
    return f"schedules: stretched from {before:,} to --schedule-frames {span:,} frames ({values(now, was)})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def cmd_eval(args: argparse.Namespace) -> int:
    from marl.app.evaluate import evaluate

    if args.member == "all":
        return _eval_members(args)
    with usage_errors():
        result = evaluate(
            args.checkpoint,
            episodes=args.episodes,
            render=args.render,
            device=args.device,
            num_envs=args.num_envs,
            seed=args.seed,
            deterministic=not args.stochastic,
            member=args.member,
        )
    episodes = _count(result["episodes"], "episode")
    for group, value in result["returns"].items():
        # The spread of single episodes' returns, named: "+-" reads as the mean's uncertainty, which is
        # sqrt(episodes) times smaller; one episode has no spread to show.
        spread = f" (std across episodes {value['std']:.4f})" if result["episodes"] > 1 else ""
        print(f"{group}: mean episode return {value['mean']:.4f} over {episodes}{spread}")
    print(f"mean episode length {result['episode_length']:.1f}")
    if args.render:
        print(f"wrote {args.render}")
    return 0


def _eval_members(args: argparse.Namespace) -> int:
    """`marl eval --member all`: every member of a run of several seeds, one after another, then per group
    the mean over the members and its 95% bootstrap CI (with a sweep, per setting over its seeds; none for a
    setting of one seed)."""
    from marl.app.checkpoint import load_checkpoint
    from marl.app.evaluate import evaluate
    from marl.app.seeds import bootstrap_ci
    from marl.config import TrainConfig

    with usage_errors():
        if args.render:
            raise ValueError("--render draws one member's episode: pass --member SEED with it, not all")
        members = TrainConfig.from_dict(load_checkpoint(args.checkpoint)["config"]).run.members()
        options = dict(episodes=args.episodes, device=args.device, num_envs=args.num_envs, seed=args.seed)
        results = {
            m.name: evaluate(args.checkpoint, deterministic=not args.stochastic, member=m.name, **options)
            for m in members
        }
    for name, result in results.items():
        returns = ", ".join(f"{g} {v['mean']:.4f}" for g, v in result["returns"].items())
        print(f"{name}: mean episode return {returns} over {_count(result['episodes'], 'episode')}")
    by_values: dict[tuple, list[dict]] = {}  # a sweep's settings each apart: pooled, their CI would mean nothing
    for m in members:
        by_values.setdefault(m.values, []).append(results[m.name])
    for group in next(iter(results.values()))["returns"]:
        for values, runs in by_values.items():
            if len(runs) == 1:  # one seed: its line above says it all; a CI of one run would mean nothing
                continue
            mean, std, low, high = bootstrap_ci([r["returns"][group]["mean"] for r in runs])
            swept = "".join(f" {k}={v:g}" for k, v in values)
            print(
                f"{group}{swept}: mean over {len(runs)} runs {mean:.4f} (95% CI {low:.4f} to {high:.4f}, std across "
                f"runs {std:.4f})"
            )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from marl.app.plot import plot_runs

    with usage_errors():
        path = plot_runs(args.run_dirs, args.out, args.x)
    print(f"wrote {path}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    import envs

    for name in envs.names():
        print(name)
        if "/" not in name:
            print(envs.describe(name))
        elif name.split("/")[0] in ADAPTERS:
            print(adapter_text(name.split("/")[0]))
    return 0


# What `marl envs` says under an adapter's pattern, which has no options of its own to list: an example,
# the options, and the extra to install (the README's "VMAS and PettingZoo environments" has the details).
ADAPTERS = {
    "vmas": (
        "vmas",
        "vmas",
        "any VMAS scenario, e.g. vmas/navigation (an unknown name lists them); options: max_steps, "
        "continuous_actions, multidiscrete_actions, and every other KEY=VALUE goes to the scenario",
    ),
    "pettingzoo": (
        "pettingzoo",
        "pettingzoo",
        "a PettingZoo env by its module, e.g. pettingzoo/mpe2.simple_spread_v3; options: max_steps "
        "(the time limit; MPE's max_cycles), and every other KEY=VALUE goes to the env",
    ),
}


def adapter_text(prefix: str) -> str:
    import importlib.util

    module, extra, text = ADAPTERS[prefix]
    if importlib.util.find_spec(module) is None:
        text += f' (not installed: pip install "vecmarl[{extra}]")'
    return f"  {text}"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, taking `-1e-3` for a negative number, a value, as it takes `-0.001`: before Python
    3.14 its pattern of negative numbers has no exponent, so `--lr -1e-3` read as `--lr` missing its value.
    (No option of marl looks like a negative number, the case where argparse takes them for options.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="marl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train_parser(subparsers).set_defaults(func=cmd_train)

    evaluate = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint, optionally rendering a GIF",
        formatter_class=HelpFormatter,
    )
    evaluate.add_argument("--checkpoint", required=True, help="a checkpoint.pt written by marl train")
    evaluate.add_argument("--episodes", type=int, default=100, help="episodes to average over")
    evaluate.add_argument("--render", metavar="GIF", help="write the first episode of env 0 to this GIF")
    evaluate.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    evaluate.add_argument(
        "--num-envs", type=int, default=None, help="envs run at once, at most --episodes; default: min(episodes, 256)"
    )
    evaluate.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")
    evaluate.add_argument(
        "--member",
        default=None,
        metavar="SEED",
        help="of a run of several seeds: the seed to evaluate (with --sweep: the run's folder name, seed_0-lr_0.001), "
        "or all",
    )
    evaluate.set_defaults(func=cmd_eval)

    from marl.app.plot import X_AXES

    plot = subparsers.add_parser("plot", help="plot the learning curves of one or more runs to an image")
    plot.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders of marl train, overlaid: a run's curves (its metrics.csv), or a population's (--seeds: "
        "the mean over its members with a 95%% CI band, from its aggregate.csv)",
    )
    plot.add_argument(
        "--out",
        default=None,
        help="the figure's path (.png, .pdf, .svg, .jpg: any format matplotlib writes; .png if none), or a folder to "
        "write learning_curve.png in (default: the first RUN_DIR/learning_curve.png)",
    )
    plot.add_argument(
        "--x",
        choices=sorted(X_AXES),
        default="frames",
        help="x axis: frames, or training time in seconds (default: frames)",
    )
    plot.set_defaults(func=cmd_plot)

    # Listed here; `main` hands `marl bench ARGS` to the benchmark's own parser (`marl.bench.suite`).
    subparsers.add_parser(
        "bench", help="run the env, kernel and training benchmarks in one table (see marl bench --help)"
    )

    listing = subparsers.add_parser("envs", help="list the envs and their options")
    listing.add_argument("--imports", nargs="+", default=[], metavar="MODULE", help="modules that register more envs")
    listing.set_defaults(func=cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`marl ARGS`; the exit status. A reader that stops early (`marl envs | head`) ends it quietly."""
    try:
        try:
            code = _run(argv)
        except SystemExit:  # argparse's --help and usage errors: what they print may still be buffered
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at exit: a closed pipe would print "Exception ignored ... BrokenPipeError"
        return code
    except BrokenPipeError:
        # As Python's docs on SIGPIPE advise: stdout to devnull, so that the flush at exit does not fail
        # again. Not SIGPIPE's default action instead, which would also kill a run whose socket (a torchrun
        # store) breaks, without a word. 128 + SIGPIPE is the status a shell reports for a tool killed by
        # SIGPIPE (`yes | head`), as 130 and 143 are for Ctrl-C and SIGTERM below.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _run(argv: list[str] | None) -> int:
    # `--imports my_envs` (and a checkpoint's imports) name modules of the current folder. `python -m
    # marl` has it on sys.path; the `marl` console script has its own folder there instead.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmarks are a command, not part of the library: imported only here
        from marl.bench.suite import main as bench_main

        bench_main(argv[1:])
        return 0
    # The `--imports` modules first: the envs and algorithms they register are choices of the parser
    # (`marl train --help` then lists a user's algorithm's options too).
    imports = argparse.ArgumentParser(add_help=False)
    imports.add_argument("--imports", nargs="+", default=[])
    try:
        import_modules(tuple(imports.parse_known_args(argv)[0].imports))
    except (ImportError, RegistrationError) as error:  # one line, as a usage error: the message names the module
        command = f"marl {argv[0]}" if argv and not argv[0].startswith("-") else "marl"
        print(f"{command}: error: {error}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as error:
        print(f"marl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except Terminated:  # the trainer has said where its last checkpoint is
        print(f"marl {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:  # Ctrl-C: the trainer has said where its last checkpoint is
        print(f"marl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
