"""`python -m envs.bench.adapters` at tiny sizes: its rows, printed and in JSON
(the timings themselves are not tested)."""

import json

import pytest

vmas = pytest.importorskip("vmas")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

from envs.bench import adapters as bench_adapters  # noqa: E402


def test_rows_and_json(tmp_path, capsys):
    path = tmp_path / "rows.json"
    rows = bench_adapters.main(
        ["--num-envs", "4", "--steps", "3", "--repeats", "1", "--instances", "2", "--json", str(path)]
    )
    assert json.loads(path.read_text()) == rows
    (row,) = rows
    assert row["num_envs"] == 4 and row["torchrl_env_steps_per_s"] is None
    rates = [row[k] for k in ("adapter_env_steps_per_s", "raw_vmas_env_steps_per_s")]
    rates.append(row["raw_vmas_inference_mode_env_steps_per_s"])
    assert all(rate > 0 for rate in rates)
    assert row["adapter_time_vs_raw"] == pytest.approx(rates[1] / rates[0])
    assert row["adapter_time_vs_raw_inference_mode"] == pytest.approx(rates[2] / rates[0])
    out = capsys.readouterr().out
    assert "command: python -m envs.bench.adapters --num-envs 4" in out and "vs inference" in out


BAD_ARGUMENTS = {
    "zero-repeats": (["--repeats", "0"], "argument --repeats: '0': expected a positive integer"),
    "zero-instances": (["--instances", "0"], "argument --instances: '0': expected a positive integer"),
    "negative-num-envs": (["--num-envs", "-4"], "argument --num-envs: '-4': expected a positive integer"),
    "zero-steps": (["--steps", "0"], "argument --steps: '0': expected a positive integer"),
    "missing-peer": (["--peer-python", "/nonexistent/python"], "--peer-python /nonexistent/python: no such"),
    "unknown-device": (["--device", "tpu"], "--device 'tpu': expected cpu, cuda or cuda:N"),
}


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_refused_before_anything_runs(argv, message, usage_error, monkeypatch):
    monkeypatch.setattr(bench_adapters, "median_rates", lambda *args: pytest.fail("median_rates ran"))
    with usage_error() as refused:
        bench_adapters.main(argv)
    assert f"python -m envs.bench.adapters: error: {message}" in refused.err


def test_a_peer_python_without_torchrl_is_refused_in_one_line(python_without_packages, usage_error, monkeypatch):
    bare = python_without_packages
    monkeypatch.setattr(bench_adapters, "median_rates", lambda *args: pytest.fail("median_rates ran"))
    with usage_error() as refused:
        bench_adapters.main(["--peer-python", str(bare)])
    assert f"error: --peer-python {bare}: torchrl, vmas not installed in that interpreter" in refused.err
