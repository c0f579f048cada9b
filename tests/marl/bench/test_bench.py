"""`marl bench`: its sections run and its time-to-target stops where it should."""

import json
import math
from dataclasses import replace

import pytest

from marl.app.cli import main
from marl.bench.suite import main as bench_main
from marl.bench.suite import navigation_config, time_to_target


def small_navigation(tmp_path, frames: int):
    config = navigation_config(frames, False, "cpu", str(tmp_path))
    return replace(config, env=replace(config.env, num_envs=32), algo=replace(config.algo, minibatch_size=512))


def test_time_to_target_stops_at_the_target_or_the_cap(tmp_path):
    seconds, frames, reached = time_to_target(small_navigation(tmp_path, 20_000), -math.inf)
    # 100-step episodes, 64-step iterations: episodes end in iterations 2, 4 and 5, the third with a return
    assert math.isfinite(seconds) and frames == 5 * 32 * 64
    seconds, frames, reached = time_to_target(small_navigation(tmp_path, 6_000), math.inf)
    assert math.isnan(seconds) and frames >= 6_000 and math.isfinite(reached)


def test_gae_section_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--device", "cpu", "--skip", "env", "replay", "train", "target", "--repeats", "2"]
    main([*argv, "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    rows = json.loads(out.read_text())
    assert [r["benchmark"] for r in rows] == ["gae elements", "gae effective bandwidth"]
    assert all(r["vecmarl"] > 0 for r in rows)
    # each row says what its figure is the median of, in the table and in the JSON
    assert printed[2].split()[-2:] == ["median", "of"]
    assert all(r["median_of"] == "2 calls" and r["device"] == "cpu" for r in rows)
    for row, line in zip(rows, printed[3:], strict=True):
        assert line.startswith("gae") and row["benchmark"] in line and "100x1024x3x1" in line
        assert line.endswith("-  2 calls")


def test_benchmarl_section_needs_a_python_with_benchmarl(tmp_path, usage_error):
    """Without `--benchmarl-python` the section does not run (the gae test's rows have none of it), so
    skipping the others leaves nothing; a missing interpreter is named, in one line, before any section runs."""
    with usage_error() as refused:
        main(["bench", "--quick", "--device", "cpu", "--skip", "env", "replay", "gae", "train", "target"])
    assert "(benchmarl runs only with --benchmarl-python)" in refused.err
    missing = str(tmp_path / "no-python")
    with usage_error() as refused:
        main(["bench", "--quick", "--skip", "env", "replay", "gae", "train", "target", "--benchmarl-python", missing])
    assert f"marl bench: error: --benchmarl-python {missing}: no such interpreter" in refused.err


@pytest.mark.parametrize("flag", ["--torchrl-python", "--jaxmarl-python", "--benchmarl-python"])
def test_a_peer_python_that_is_not_python_is_refused_before_any_section(usage_error, flag, not_python):
    # Before, a program exiting 0 without output passed for a Python with every module, and the section
    # failed with a traceback; a file that is not executable was "no such interpreter".
    for python, reason in not_python:
        with usage_error() as refused:
            main(["bench", "--quick", "--skip", "env", "replay", "train", "target", flag, str(python)])
        assert refused.err.strip().endswith(f"marl bench: error: {flag} {python}: {reason}")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats", "0"], "argument --repeats: must be >= 1 (timed runs per figure), got 0"),
        (["--repeats", "-2"], "argument --repeats: must be >= 1"),
        (["--target", "2"], "argument --target: must be in (0, 1]"),
        (["--target", "-1"], "argument --target: must be in (0, 1]"),
        (["--target", "0"], "argument --target: must be in (0, 1]"),
        (["--target", "nan"], "argument --target: must be in (0, 1]"),
        (["--target", "most"], "argument --target: expected a number, got 'most'"),
    ],
)
@pytest.mark.parametrize("entry", ["marl", "bench"])
def test_bad_arguments_are_refused_before_any_section_runs(argv, message, entry, usage_error):
    argv = ["--quick", "--no-vmas", "--skip", "gae", "replay", "train", "target", *argv]
    with usage_error() as refused:
        main(["bench", *argv]) if entry == "marl" else bench_main(argv)
    assert f"marl bench: error: {message}" in refused.err


@pytest.mark.parametrize(
    "skip, unless",
    [
        (["env", "gae", "replay", "train", "target", "benchmarl"], ""),
        (["target", "train", "replay", "gae", "env"], " (benchmarl runs only with --benchmarl-python)"),
    ],
)
@pytest.mark.parametrize("entry", ["marl", "bench"])
def test_a_skip_that_leaves_no_section_is_refused(skip, unless, entry, tmp_path, usage_error):
    # It printed the table's header and no rows (and wrote [] to --json).
    argv = ["--quick", "--no-vmas", "--skip", *skip, "--json", str(tmp_path / "bench.json")]
    with usage_error() as refused:
        main(["bench", *argv]) if entry == "marl" else bench_main(argv)
    assert refused.out == "" and not (tmp_path / "bench.json").exists()
    assert refused.err.splitlines()[-1] == (
        f"marl bench: error: --skip {' '.join(skip)} leaves no section to run{unless}: the sections are "
        "env, gae, replay, train, target, benchmarl"
    )


def test_gae_section_times_each_call_repeats_times(monkeypatch, capsys):
    import kernels.bench.gae

    counts = []

    def fake_median_seconds(calls, repeats, device):
        counts.append(repeats)
        return {name: 1e-3 for name in calls}

    monkeypatch.setattr(kernels.bench.gae, "median_seconds", fake_median_seconds)
    main(["bench", "--quick", "--device", "cpu", "--skip", "env", "replay", "train", "target", "--repeats", "7"])
    assert counts == [7]


def test_quick_leaves_out_the_compiled_rows_and_the_target_section(monkeypatch, capsys, usage_error):
    """`--quick` took over 4 minutes on a 2-core CPU, most of it compiling (env steps, training steps, the
    replay's draw) and training to a target: it times eager rows at small sizes and says what it leaves out;
    the full run is unchanged."""
    import marl.bench.replay
    import marl.bench.suite as suite

    calls = []

    def record(*call, value=1.0):
        calls.append(call)
        return value

    monkeypatch.setattr(suite.env_bench, "time_vmas", lambda *args: 1.0)
    monkeypatch.setattr(
        suite.env_bench,
        "time_vecmarl",
        lambda env, n, agents, steps, runs, device, compiled: record("env", n, steps, compiled),
    )
    monkeypatch.setattr(
        marl.bench.replay,
        "bench_replay",
        lambda capacity, **options: record("replay", capacity, options["compiled"], value={"rows": []}),
    )
    monkeypatch.setattr(
        suite, "train_rate", lambda config, *args: record("train", config.env.num_envs, config.run.compile)
    )
    monkeypatch.setattr(suite, "yardsticks", lambda env_name, device: (0.0, 1.0))
    monkeypatch.setattr(
        suite, "time_to_target", lambda config, target: record("target", config.env.env, value=(1.0, 100, 1.0))
    )
    bench_main(["--quick", "--device", "cpu", "--skip", "gae"])
    assert calls == [("env", 1024, 25, False)] * 2 + [
        ("replay", 65_536, False),
        ("train", 128, False),
        ("train", 16, False),
    ]
    assert "; --quick: small sizes, no compiled rows, no target section" in capsys.readouterr().out.splitlines()[1]
    calls.clear()
    bench_main(["--device", "cpu", "--skip", "gae"])
    env = [("env", n, 100, compiled) for n in (1024, 4096) for compiled in (False, True)]
    train = [("train", n, compiled) for compiled in (False, True) for n in (256, 16, 1024)]
    assert calls == [*env, *env, ("replay", 1_000_000, True), *train, ("target", "navigation"), ("target", "spread")]
    assert "--quick" not in capsys.readouterr().out
    with usage_error() as refused:  # target alone under --quick: nothing would run
        bench_main(["--quick", "--skip", "env", "gae", "replay", "train"])
    assert "leaves no section to run (benchmarl runs only with --benchmarl-python) (--quick leaves out target)" in (
        refused.err
    )
