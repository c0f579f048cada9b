"""`python -m kernels.bench.gae`: bad arguments are refused with a one-line usage error before anything is timed."""

import pytest
import torch

from kernels.bench import gae as bench

BAD_ARGUMENTS = {
    "zero-repeats": (["--repeats", "0"], "argument --repeats: '0': expected a positive integer"),
    "zero-rounds": (["--rounds", "0"], "argument --rounds: '0': expected a positive integer"),
    "negative-threads": (["--threads", "-1"], "argument --threads: '-1': expected a positive integer"),
    "sizes-not-numbers": (["--sizes", "abc"], "argument --sizes: sizes 'abc': expected e.g. 100x1024x3x1"),
    "unknown-device": (["--device", "bogus"], "--device 'bogus': expected cpu, cuda or cuda:N"),
    "unknown-backend": (["--backends", "auto,gpu"], "--backends auto,gpu: backend='gpu' is not one of"),
    "negative-peak": (["--peak-gbps", "-5"], "--peak-gbps -5.0: expected a positive number of GB/s"),
    "missing-peer": (
        ["--peer-python", "/nonexistent/python"],
        "--peer-python /nonexistent/python: no such interpreter",
    ),
    "json-in-missing-folder": (
        ["--json", "/nonexistent/out.json"],
        "--json /nonexistent/out.json: its folder does not",
    ),
}


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_refused_before_anything_runs(argv, message, usage_error, monkeypatch):
    monkeypatch.setattr(bench, "bench_size", lambda *args: pytest.fail("bench_size ran"))
    with usage_error() as refused:
        bench.main(["--sizes", "4x2x3x1", *argv])
    assert f"python -m kernels.bench.gae: error: {message}" in refused.err


def test_a_peer_python_without_torchrl_is_refused_in_one_line(python_without_packages, usage_error, monkeypatch):
    bare = python_without_packages
    monkeypatch.setattr(bench, "bench_size", lambda *args: pytest.fail("bench_size ran"))
    with usage_error() as refused:
        bench.main(["--sizes", "4x2x3x1", "--peer-python", str(bare)])
    assert f"error: --peer-python {bare}: torchrl not installed in that interpreter" in refused.err


def test_cuda_where_there_is_none_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda"])
    assert "--device cuda: CUDA is not available here; use --device cpu" in capsys.readouterr().err


def test_a_tiny_run_prints_its_table(capsys, tmp_path):
    bench.main(
        ["--sizes", "4x2x3x1", "--repeats", "1", "--backends", "torch,reference", "--json", str(tmp_path / "b.json")]
    )
    out = capsys.readouterr().out
    assert 'gae(backend="torch")' in out and "gae_reference (plain loop)" in out
    assert (tmp_path / "b.json").exists()


@pytest.mark.gpu
def test_on_cuda_a_row_times_the_kernel_in_one_cuda_graph():
    rows, _ = bench.bench_size((16, 64, 3, 1), torch.device("cuda"), ["auto"], 3, 1, None, None)
    graph = next(row for row in rows if "CUDA graph" in row["call"])  # left out where the capture failed
    assert graph["max_abs_diff_vs_reference"] < 1e-4  # the replayed calls compute what a call does
