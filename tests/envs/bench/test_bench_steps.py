"""`python -m envs.bench.steps`: bad arguments are refused in one usage line before anything is timed."""

import json

import pytest

from envs.bench import steps as bench_steps

BAD_ARGUMENTS = {
    "zero-repeats": (["--repeats", "0"], "argument --repeats: '0': expected a positive integer"),
    "negative-steps": (["--steps", "-1"], "argument --steps: '-1': expected a positive integer"),
    "zero-num-envs": (["--num-envs", "8", "0"], "argument --num-envs: '0': expected a positive integer"),
    "zero-agents": (["--n-agents", "0"], "argument --n-agents: '0': expected a positive integer"),
    "unknown-device": (["--device", "tpu"], "--device 'tpu': expected cpu, cuda or cuda:N"),
    "json-in-missing-folder": (["--json", "/nonexistent/out.json"], "--json /nonexistent/out.json: its folder"),
}


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_refused_before_anything_runs(argv, message, usage_error, monkeypatch):
    monkeypatch.setattr(bench_steps, "time_vecmarl", lambda *args: pytest.fail("time_vecmarl ran"))
    with usage_error() as refused:
        bench_steps.main(["--no-vmas", *argv])
    assert f"python -m envs.bench.steps: error: {message}" in refused.err


def test_cuda_where_there_is_none_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(bench_steps.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench_steps.main(["--device", "cuda"])
    assert "--device cuda: CUDA is not available here; use --device cpu" in capsys.readouterr().err


def test_the_json_holds_the_printed_rows_with_their_ratios(tmp_path, capsys):
    pytest.importorskip("vmas")
    path = tmp_path / "rows.json"
    argv = ["--num-envs", "4", "--n-agents", "2", "--steps", "3", "--repeats", "1", "--no-compile"]
    rows = bench_steps.main([*argv, "--json", str(path)])
    assert json.loads(path.read_text()) == rows
    (row,) = rows
    assert (row["num_envs"], row["n_agents"], row["steps"], row["repeats"], row["device"]) == (4, 2, 3, 1, "cpu")
    ratio = row["vecmarl_eager_env_steps_per_s"] / row["vmas_env_steps_per_s"]
    assert row["vecmarl_eager_vs_vmas"] == pytest.approx(ratio)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:3] == ["navigation", "4", "2"] and line.endswith(f"{ratio:.2f}x")
