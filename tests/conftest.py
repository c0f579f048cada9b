import os

# Triton kernels run on the CPU through Triton's interpreter; it must be chosen before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# `.ci/run` installs every extra the tests use (VMAS, PettingZoo, mpe2, TensorBoard, matplotlib): there a
# test that `importorskip`s one must fail, not skip, or a broken install would pass CI unseen.
MISSING_EXTRA_FAILS = os.environ.get("VECMARL_CI") == "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
