"""`python -m marl.bench.replay` (its `main`) and `marl bench`'s replay section, at tiny sizes (numbers
mean nothing)."""

import json

import pytest

import marl.bench.suite
from marl.bench.suite import main as bench_main


@pytest.mark.usefixtures("without_inductor")  # its compiled row's graph, traced; Inductor's code is tested apart
def test_the_replay_benchmark_prints_its_table_and_writes_the_json(tmp_path, capsys):
    from marl.bench.replay import main

    out = tmp_path / "replay.json"
    argv = ["--capacity", "2048", "--extend", "4x16", "--batch-sizes", "32", "--repeats", "2", "--json", str(out)]
    main([*argv, "--profile"])  # the CPU takes the sum tree's torch path, as a user's does (tests/marl/conftest.py)
    printed = capsys.readouterr().out
    assert "python -m marl.bench.replay --capacity 2048" in printed
    report = json.loads(out.read_text())
    calls = {(row["call"], row["sampler"]) for row in report["rows"]}
    assert {("sample(32)", "uniform"), ("sample(32)", "prioritized")} <= calls
    assert ("select + gather + set_priority_ of 32, compiled", "prioritized") in calls
    assert all(row["vecmarl_ms"] > 0 and row["torchrl_ms"] is None for row in report["rows"])
    # --profile: the prioritized sample + update's ops, as torch's profiler counted them over 10 calls.
    assert report["profile"].startswith("profile: update_priority(sample(32).index, [32]), 10 calls on cpu: ")
    # Its table lists the 15 ops that took longest on the host; which ones varies with the machine's load.
    assert "Self CPU time total" in report["profile"] and "aten::" in report["profile"]
    assert report["profile"] in printed


def test_the_suite_section_reports_calls_per_second(monkeypatch, capsys):
    report = {"rows": [{"call": "sample(128)", "sampler": "uniform", "vecmarl_ms": 0.5, "torchrl_ms": 2.0}]}
    seen = {}

    def fake(capacity, **options):
        seen.update(capacity=capacity, **options)
        return report

    monkeypatch.setattr("marl.bench.replay.bench_replay", fake)
    rows = bench_main(["--quick", "--device", "cpu", "--skip", "env", "gae", "train", "target"])
    assert seen["capacity"] == 65_536 and seen["batch_sizes"] == (128,)
    (row,) = rows
    assert (row["benchmark"], row["vecmarl"], row["peer_value"], row["ratio"], row["median_of"]) == (
        "sample(128) uniform",
        2000.0,
        500.0,
        4.0,
        "12 calls",  # --repeats 3, 4 calls each
    )
    assert "replay" in marl.bench.suite.__doc__


def test_the_suite_table_keeps_the_longest_replay_names_apart_from_their_size(monkeypatch, capsys):
    # At a width of 36 the names ran into the size column: "update_priority(...) prioritized65,536 cap".
    names = ["update_priority(sample(4096).index, [4096])", "select + gather + set_priority_ of 4096, compiled"]
    rows = [{"call": name, "sampler": "prioritized", "vecmarl_ms": 0.5, "torchrl_ms": None} for name in names]
    monkeypatch.setattr("marl.bench.replay.bench_replay", lambda capacity, **options: {"rows": rows})
    bench_main(["--quick", "--device", "cpu", "--skip", "env", "gae", "train"])
    header, *lines = capsys.readouterr().out.splitlines()[2:]
    for name, line in zip(names, lines, strict=True):
        assert line.index(" 65,536 cap") + 1 == header.index("size") and f"{name} prioritized " in line


def test_a_peer_python_that_is_not_python_is_refused_before_timing(tmp_path, usage_error, not_python):
    # Before, a program that is not Python ran vecmarl's side, then failed with an IndexError reading the
    # peer's report; a file that is not executable was timed without its peer ("peer failed: Permission denied").
    from marl.bench.replay import main

    for python, reason in not_python + [(tmp_path / "missing", "no such interpreter")]:
        with usage_error() as refused:
            main(["--capacity", "2048", "--extend", "4x16", "--batch-sizes", "32", "--peer-python", str(python)])
        assert refused.err.strip().endswith(f"python -m marl.bench.replay: error: --peer-python {python}: {reason}")
        assert refused.out == ""
