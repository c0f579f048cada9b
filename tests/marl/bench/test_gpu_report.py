"""`python -m marl.bench.gpu_report`: the dry run CI makes, the steps' commands (each parses with its own
program's parser), the runner (a failing or hanging step does not lose the rest), and the parsers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marl.app.cli import build_parser as train_parser
from marl.app.cli import config_from_args
from marl.app.cli import main as marl_main
from marl.bench import gpu_report
from marl.bench.gpu_report import Step
from tests.commands import run_module_main

ROOT = Path(__file__).resolve().parents[3]
STEPS = gpu_report.steps(Path("/tmp/report"))


def test_the_dry_run_writes_both_reports_and_exits_0(tmp_path):
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "marl.bench.gpu_report", str(out), "--dry"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "nothing run" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "dry" and report["reason"]
    assert {"torch", "triton", "tensordict"} <= set(report["versions"])
    assert [s["name"] for s in report["steps"]] == [s.name for s in STEPS]
    assert all(s["status"] == "not run" and s["command"].startswith("python -m ") for s in report["steps"])
    text = (out / "report.txt").read_text()
    assert report["reason"] in text and all(s.name in text for s in STEPS)
    assert not list(out.glob("step_*.log"))


def test_the_steps_fit_the_budget_and_cover_the_issue():
    names = [s.name for s in STEPS]
    assert len(set(names)) == len(names)
    assert sum(s.timeout_s for s in STEPS) <= 8 * 60 + 1
    assert sum(s.timeout_s for s in gpu_report.steps(Path("x"), minutes=2)) <= 2 * 60 + 1
    commands = {s.name: s.command for s in STEPS}
    assert commands["gpu_tests"][:3] == ["python", "-m", "pytest"] and "gpu" in commands["gpu_tests"]
    assert set(gpu_report.native_envs()) == {"navigation", "spread", "tag", "speaker_listener"}
    assert set(gpu_report.native_envs()) <= set(commands["check_envs"])
    assert all("cuda" in command for command in commands.values() if command[2] != "pytest")
    assert "--compile" in commands["train_compile"] and "--compile" not in commands["train_eager"]
    assert "--compile" in commands["seeds_compile"] and "--compile" not in commands["seeds"]


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_each_command_parses_with_its_own_parser(step, parse_only, monkeypatch, capsys):
    words = step.command
    assert words[:2] == ["python", "-m"]
    module = words[2]
    if module == "pytest":
        assert (ROOT / words[-1]).is_dir()
        assert "gpu:" in (ROOT / "pyproject.toml").read_text()  # the marker `-m gpu` selects
        return
    if module == "marl":
        with pytest.raises(parse_only):
            marl_main(words[3:])
        return
    with pytest.raises(parse_only):
        run_module_main(words, monkeypatch)


@pytest.mark.parametrize("step", [s for s in STEPS if s.command[2] == "marl"], ids=lambda s: s.name)
def test_train_commands_are_valid_configs(step):
    """Past the parser: the options build a config, and the minibatch fits an iteration."""
    config = config_from_args(train_parser().parse_args(step.command[3:]))
    config.algo.check_train(config)


def fake_steps(out: Path, minutes: float = 8.0) -> list[Step]:
    python = ["python", "-c"]
    return [  # the hanging one first: later ones get the time earlier ones leave unused
        Step(
            "hangs",
            [*python, "import time; time.sleep(60)"],
            1,
            lambda text, out: json.loads((out / "hangs.json").read_text()),
        ),
        Step("ok", [*python, "print('{\"x\": 1}')"], 10, lambda text, out: json.loads(text.splitlines()[-1])),
        Step("fails", [*python, "import sys; sys.exit(3)"], 10, lambda text, out: {}),
        Step("after", [*python, "print('still runs')"], 10, lambda text, out: {"seen": "still runs" in text}),
    ]


def test_the_runner_survives_a_failing_and_a_hanging_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_report, "steps", fake_steps)
    monkeypatch.setattr(gpu_report, "find_gpu", lambda: ("Fake GPU", ""))
    assert gpu_report.main([str(tmp_path), "--minutes", "1"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["mode"] == "gpu" and report["gpu"] == "Fake GPU"
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["ok"]["status"] == 0 and steps["ok"]["figures"] == {"x": 1}
    assert steps["fails"]["status"] == 3
    assert steps["hangs"]["status"] == "timeout" and "parse_error" in steps["hangs"]["figures"]
    assert steps["after"]["status"] == 0 and steps["after"]["figures"] == {"seen": True}
    assert (tmp_path / "step_hangs.log").read_text().startswith("$ python -c")
    assert "Fake GPU" in (tmp_path / "report.txt").read_text()
    assert "2 step(s) failed or cut: ['hangs', 'fails']" in capsys.readouterr().out


def test_the_parsers_read_what_the_steps_write(tmp_path):
    verbose = (
        "tests/kernels/test_dispatch.py::test_a[fp32] PASSED [ 33%]\n"
        "tests/kernels/test_dispatch.py::test_a[bf16] FAILED [ 66%]\n"
        "tests/marl/app/test_cuda_graphs.py::test_b[unroll1] PASSED [100%]\n"
        "=== 1 failed, 2 passed in 4.2s ===\n"
    )
    xdist = "[gw3] [ 50%] PASSED tests/kernels/test_sum_tree.py::test_c[4096]\n[gw0] [100%] SKIPPED tests/x.py::d\n"
    assert gpu_report.parse_pytest(verbose + xdist, tmp_path) == {
        "tests": {"passed": 3, "failed": 1, "skipped": 1},
        "not_passed": ["tests/kernels/test_dispatch.py::test_a[bf16] FAILED", "tests/x.py::d SKIPPED"],
    }
    run = tmp_path / "runs" / "train-compile"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "iteration,frames,time_s,frames_per_s\n1,16384,40.0,409.6\n2,32768,40.1,163840\n3,49152,40.2,163840\n"
    )
    log = (
        "W... skipping cudagraphs due to mutated inputs\n"
        "CUDA graphs: rollout step: captured (2 CUDA graphs of 2 graphs)\n"
        "trainer.py:170: RuntimeWarning: CUDA graphs: update step: not captured (1 of its graphs skipped): mutated"
        " inputs (1 instances); its kernels are launched one by one\n"
    )
    figures = gpu_report.parse_train("train-compile")(log, tmp_path)
    assert figures["iterations"] == 3 and figures["median_frames_per_s_after_first"] == 163840
    assert figures["first_iteration_s"] == 40.0 and figures["cudagraph_skips"] == 1
    assert figures["cuda_graphs"] == {
        "rollout step": "captured (2 CUDA graphs of 2 graphs)",
        "update step": "not captured (1 of its graphs skipped): mutated inputs (1 instances); its kernels are"
        " launched one by one",
    }
    table = (
        "env         num_envs n_agents     vecmarl eager  vecmarl compiled        VMAS     ratio eager  ratio compiled\n"
        "navigation      4096        3        12,345,678        45,678,901           -               -               -\n"
    )
    assert gpu_report.parse_env_steps(table, tmp_path) == {
        "navigation 4096 envs": {"eager": 12345678, "compiled": 45678901}
    }
    line = json.dumps({"env": "tag", "device": "cuda", "num_envs": 4096, "result": "ok", "seconds": 1.0})
    assert gpu_report.parse_check_envs(f"noise\n{line}\n", tmp_path)["check_env"] == {"tag": "ok"}
    seeds = {"rows": [{"env": "navigation", "kind": "5 seeds", "median_s": 12.345, "ratio": 1.234}]}
    (tmp_path / "step_seeds_compile.json").write_text(json.dumps(seeds))
    figures = gpu_report.parse_seeds("seeds_compile")("", tmp_path)
    assert figures == {"navigation 5 seeds": {"s": 12.3, "ratio": 1.23}}
    replay = {
        "rows": [{"call": "sample(128)", "sampler": "uniform", "vecmarl_ms": 0.12345}],
        "profile": "profile: update_priority(...): 300 us of host time per call, 40 CUDA kernels per call\n| table |",
    }
    (tmp_path / "step_replay.json").write_text(json.dumps(replay))
    assert gpu_report.parse_replay("", tmp_path) == {
        "sample(128) uniform": 0.1235,
        "profile": "profile: update_priority(...): 300 us of host time per call, 40 CUDA kernels per call",
    }


def test_the_check_envs_worker_runs_check_env(capsys):
    assert gpu_report.main(["--check-envs", "navigation", "--device", "cpu", "--num-envs", "4"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["env"] == "navigation" and result["result"] == "ok"
