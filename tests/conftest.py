import argparse
import contextlib
import os
import stat
import sys
import types

import pytest
import torch  # importing torch (and asking it for CUDA) imports no triton: TRITON_INTERPRET below still applies

# Without a GPU, Triton kernels run on the CPU through Triton's interpreter, which must be chosen before
# triton is first imported (by a test module, after this file). With one, the `gpu` tests run the
# compiled kernels, so the interpreter stays off; the tests that need it say so (`needs_interpreter`).
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETER = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")  # as triton reads it
if INTERPRETER:
    try:
        import triton  # noqa: F401  (after TRITON_INTERPRET is set)
    except ImportError:  # no Triton (not Linux): the kernels' torch paths run instead
        pass
    else:
        from tests import interpreter_scan

        interpreter_scan.install()

# One intra-op thread per test process (and its subprocesses), unless the caller chose: the suite's ops are
# small, and on a CPU other jobs share, a second thread waiting for a busy core made the learning tests
# two to ten times slower (a shared 2-core machine: the VDN-on-spread test 15 s with one thread, 30 s with
# two; 419 s with two under three other jobs).
if not CUDA and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Compiling Inductor's C++ for the compiled-vs-eager tests is about half of the suite's CPU time. Without a
# GPU the test processes (and the runs they start) compile in-process, with no pool of worker processes to
# start in each, and emit scalar C++, with no SIMD variants to generate and compile: together a fifth less
# CPU time for the suite. The tests check vecmarl's graphs (one graph, writes in place, no host sync, eager
# numbers), which scalar code runs the same; TORCHINDUCTOR_VEC_ISA_OK=1 tests the vectorized code instead.
# Read when inductor's config is first imported, which `import torch` does not do.
if not CUDA:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

# `.ci/run` installs every extra the tests use (VMAS, PettingZoo, mpe2, TensorBoard, matplotlib): there a
# test that `importorskip`s one must fail, not skip, or a broken install would pass CI unseen.
MISSING_EXTRA_FAILS = os.environ.get("VECMARL_CI") == "1"


def pytest_collection_modifyitems(config, items):
    # By marker, not `"gpu" in item.keywords`: keywords hold every folder name on the test's path too, so
    # a checkout under a folder named `gpu` skipped the whole suite.
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_interpreted = pytest.mark.skip(
        reason="runs Triton on CPU tensors, which needs TRITON_INTERPRET=1 (set by this conftest without a GPU);"
        " with a GPU the `gpu` tests run the compiled kernels instead"
    )
    for item in items:
        if item.get_closest_marker("gpu") is not None and not CUDA:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("needs_interpreter") is not None and not INTERPRETER:
            item.add_marker(skip_interpreted)
    # The slowest tests first: under `--dist worksteal` (pyproject.toml) the first worker starts on them and
    # an idle one takes over the fast tests at the end of its queue; one slow test left to the end (the
    # tutorials' are collected last) kept one worker busy alone for half a minute.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _fail_a_missing_extra(report) -> None:
    """Under `.ci/run`, turn a skip for a module that could not be imported into a failure."""
    if not (MISSING_EXTRA_FAILS and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = report.longrepr[2]
    if "could not import" in reason:
        report.outcome = "failed"
        report.longrepr = f"VECMARL_CI=1 (.ci/run installs every extra), yet a test skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_a_missing_extra(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_a_missing_extra(outcome.get_result())


class Parsed(Exception):
    """Raised right after a program's arguments parsed: the command is valid, nothing runs."""


@pytest.fixture
def parse_only(monkeypatch):
    """Every argparse parser stops right after parsing, raising the exception this returns: a command is
    checked (`with pytest.raises(parse_only): main(argv)`), not run."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    return Parsed


@pytest.fixture
def usage_error(capsys):
    """`with usage_error() as refused: main(argv)`: the command must stop with a usage error (exit status 2, as
    argparse's `parser.error`), without a traceback; then `refused.out` and `refused.err` are what it printed."""

    @contextlib.contextmanager
    def refusal():
        refused = types.SimpleNamespace(out=None, err=None)
        with pytest.raises(SystemExit) as exit:
            yield refused
        assert exit.value.code == 2
        refused.out, refused.err = capsys.readouterr()
        assert "Traceback" not in refused.err

    return refusal


@pytest.fixture
def python_without_packages(tmp_path) -> str:
    """The path of a Python where no installed package can be found (this interpreter run with `-S`): what
    a benchmark's `--peer-python` must refuse when it lacks the peer's library."""
    path = tmp_path / "python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def read_only(monkeypatch):
    """`read_only(path)` takes the write bits off `path` (given back after the test), and makes os.access
    honour them for root too: root may write whatever the bits say, so a test of a read-only run folder would
    otherwise pass or fail by who runs it (root in CI containers)."""
    access, made = os.access, []

    def access_as_a_user(path, mode, **kwargs):
        if mode & os.W_OK and not os.stat(path).st_mode & stat.S_IWUSR:
            return False
        return access(path, mode, **kwargs)

    def make_read_only(path):
        made.append((path, path.stat().st_mode))
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

    monkeypatch.setattr(os, "access", access_as_a_user)
    yield make_read_only
    for path, mode in made:
        path.chmod(mode)


def static_mutations_backend(graphs: list):
    """A CPU backend for `maybe_compile` (in place of `envs.compile._inductor_cpu`): AOTAutograd's trace,
    run without Inductor, that appends to `graphs` each forward graph's `(inputs, inputs written, inputs
    written but not marked static)`, the last as CUDA graphs need it empty (torch records no CUDA graph
    of a step that writes an input not marked static, "mutated inputs")."""
    from torch._dynamo.backends.common import aot_autograd

    def backend(graph, example_inputs, cpp_wrapper=False):
        def forward_compiler(module, inputs):
            meta = torch._guards.TracingContext.try_get().fw_metadata
            mutated = {i for i, info in enumerate(meta.input_info) if info.mutates_data or info.mutates_metadata}
            graphs.append((len(inputs), sorted(mutated), sorted(mutated - set(meta.static_input_indices))))
            return module

        return aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)(graph, example_inputs)

    return backend


def mark_static_everywhere(monkeypatch) -> None:
    """`envs.cudagraphs.mark_static` marks on every device what it marks on CUDA only."""
    from envs import cudagraphs

    def mark(tensors, device):
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)

    monkeypatch.setattr(cudagraphs, "mark_static", mark)


@pytest.fixture
def without_inductor(monkeypatch):
    """On the CPU, what `maybe_compile` compiles (`--compile`, `compile=True` envs) is traced as it always
    is (Dynamo, then AOTAutograd's functionalization) and run without Inductor's C++ code: for the tests
    of what the compiled graphs are (one graph, no recompile, what they write, eager's numbers), not of the
    code Inductor makes of them. Generating and building that code took four fifths of such a test's time
    (a PPO rollout and update step compiled five times as fast without it). Inductor's code is held to eager
    by the tests that leave this out: PPO's rollout (navigation) and update steps
    (`test_compiled_training_matches_eager`), the overlapped critic, spread's physics and the sum tree's
    torch path (which an off-policy step with prioritized replay writes in place).
    The `gpu` tests compile for CUDA (Inductor, CUDA graphs), which this leaves alone.

    What the compiled steps mark static for CUDA graphs is marked here too, and at the end of the test
    every graph compiled must have written only inputs marked static: on CUDA, torch would not record a
    graph of one that writes another (`tests/marl/app/test_cuda_graphs.py` says more)."""
    import envs.compile

    graphs: list = []
    monkeypatch.setattr(envs.compile, "_inductor_cpu", static_mutations_backend(graphs))
    mark_static_everywhere(monkeypatch)
    yield
    assert graphs, "the test asked for without_inductor but compiled nothing with it"
    written = [not_static for _, _, not_static in graphs if not_static]
    assert not written, f"compiled graphs (inputs, written, written but not static) write unmarked inputs: {graphs}"
