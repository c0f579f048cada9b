"""`python -m marl.bench.{replay,train,seeds,recurrent}`: a count of 0 or below, an unknown name or value is
refused in one usage line naming the option, before anything is timed (no traceback, no table of nonsense)."""

import argparse
import importlib

import pytest

from marl.bench import recurrent, replay, seeds, train

# module, where the timing starts (patched to fail: nothing may run), argv, the error after "error: "
BAD_ARGUMENTS = {
    "replay-zero-repeats": (replay, "bench_replay", ["--repeats", "0"], "argument --repeats: '0': expected a positive"),
    "replay-zero-rounds": (replay, "bench_replay", ["--rounds", "0"], "argument --rounds: '0': expected a positive"),
    "replay-zero-capacity": (replay, "bench_replay", ["--capacity", "0"], "argument --capacity: '0': expected a"),
    "train-zero-repeats": (train, "run_case", ["--quick", "--repeats", "0"], "argument --repeats: '0': expected a"),
    "train-zero-frames": (train, "run_case", ["--quick", "--frames", "0"], "argument --frames: '0': expected a"),
    "train-zero-threads": (train, "run_case", ["--quick", "--threads", "0"], "argument --threads: '0': expected a"),
    "train-negative-default-iterations": (
        train,
        "run_case",
        ["--quick", "--default-iterations", "-1"],
        "argument --default-iterations: -1: expected 0 (skip those rows) or more",
    ),
    "seeds-unknown-env": (seeds, "bench_seeds", ["--envs", "nope"], "argument --envs: unknown env 'nope'; known"),
    "seeds-one-seed": (seeds, "bench_seeds", ["--seeds", "1"], "argument --seeds: 1: expected at least 2"),
    "seeds-zero-threads": (seeds, "bench_seeds", ["--threads", "0"], "argument --threads: '0': expected a"),
    "seeds-zero-num-envs": (seeds, "bench_seeds", ["--num-envs", "0"], "argument --num-envs: '0': expected a"),
    "seeds-zero-hidden": (seeds, "bench_seeds", ["--hidden", "64", "0"], "argument --hidden: '0': expected a"),
    "recurrent-one-iteration": (
        recurrent,
        "time_train",
        ["--iterations", "1"],
        "argument --iterations: 1: expected at least 2 (the first is not counted)",
    ),
    "recurrent-zero-repeats": (recurrent, "time_pass", ["--repeats", "0"], "argument --repeats: '0': expected a"),
    "recurrent-zero-threads": (recurrent, "time_pass", ["--threads", "0"], "argument --threads: '0': expected a"),
    "recurrent-unknown-gru-nets": (
        recurrent,
        "time_pass",
        ["--gru-nets", "nope"],
        "argument --gru-nets: gru_nets must be one of ['policy', 'critic', 'both'], got 'nope'",
    ),
    # a --json that could not be written once the runs are done (the JSON was lost with a traceback)
    **{
        f"{module.__name__.split('.')[-1]}-json-in-missing-folder": (
            module,
            timing,
            ["--json", "/nonexistent/bench.json"],
            "--json /nonexistent/bench.json: the folder /nonexistent does not exist",
        )
        for module, timing in ((replay, "bench_replay"), (train, "run_case"), (seeds, "bench_seeds"))
    },
    # a device that cannot run here, and sizes no run can take (PPO's default minibatch of 4096 frames against
    # an iteration of 16 x 8): each was a traceback from inside the first run
    "replay-cuda": (replay, "bench_replay", ["--device", "cuda"], "argument --device: device cuda was asked for"),
    "seeds-cuda": (seeds, "bench_seeds", ["--device", "cuda"], "argument --device: device cuda was asked for"),
    "seeds-minibatch-over-an-iteration": (
        seeds,
        "bench_seeds",
        ["--num-envs", "16", "--rollout-length", "8"],
        "minibatch_size=4096 is larger than an iteration's num_envs * rollout_length = 128 frames",
    ),
}


@pytest.mark.parametrize("module, timing, argv, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_refused_before_anything_runs(module, timing, argv, message, monkeypatch, usage_error):
    monkeypatch.setattr(module, timing, lambda *args, **kwargs: pytest.fail(f"{timing} ran"))
    monkeypatch.setattr(module.torch, "set_num_threads", lambda n: pytest.fail("set_num_threads ran"))
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    with usage_error() as refused:
        module.main(argv)
    assert f"python -m marl.bench.{module.__name__.split('.')[-1]}: error: {message}" in refused.err


def test_recurrent_help_names_its_command_and_explains_parts(capsys):
    with pytest.raises(SystemExit):
        recurrent.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m marl.bench.recurrent") and "what to time" in out


class Captured(Exception):
    pass


@pytest.mark.parametrize(
    "module",
    [
        "envs.bench.steps",
        "envs.bench.adapters",
        "kernels.bench.gae",
        "marl.bench.replay",
        "marl.bench.train",
        "marl.bench.seeds",
        "marl.bench.recurrent",
        "marl.bench.gpu_report",
        "marl.bench.suite",
    ],
)
def test_help_explains_every_option(module, monkeypatch):
    """Each option of each benchmark has a help line (`--help` prints nothing but its name otherwise)."""
    parsers = []

    def capture(self, args=None, namespace=None):
        parsers.append(self)
        raise Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Captured):
        importlib.import_module(module).main([])
    unexplained = [a.option_strings or a.dest for a in parsers[-1]._actions if not a.help]
    assert not unexplained, f"{module}: options without help: {unexplained}"
