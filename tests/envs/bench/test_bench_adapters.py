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
