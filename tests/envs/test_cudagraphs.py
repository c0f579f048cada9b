"""`envs.cudagraphs`: what torch reports about CUDA graph capture, attributed to the compiled function.

Without a GPU nothing is recorded, so these feed the watcher what torch itself emits: its skip function
(`log_cudagraph_skip_and_bump_counter`, the one every skip goes through), the callbacks its cudagraph
trees run around a recording, and real CPU compiles for the graph count.
"""

import pytest
import torch
from torch._dynamo.callback import CallbackTrigger
from torch._inductor.cudagraph_utils import format_default_skip_message, log_cudagraph_skip_and_bump_counter

import envs.compile
from envs import cudagraphs

MUTATION = format_default_skip_message("mutated inputs (2 instances)") + (
    '. Found from : \n   File "/src/marl/core/rollout.py", line 88, in update\n    self.length += 1\n'
)


@pytest.fixture(autouse=True)
def fresh_reports():
    cudagraphs.clear()
    yield
    cudagraphs.clear()


def record_a_cuda_graph(non_static_inputs: int = 0):
    """What torch's cudagraph trees do around each recording (`CUDAGraphTreeManager.record_function`,
    which counts the graph's inputs that are not static as it builds the graph's node)."""
    from torch._dynamo.utils import counters

    with torch._dynamo.callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += non_static_inputs


def compile_a_graph():
    torch._dynamo.reset()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))


def test_a_recorded_graph_is_captured():
    with cudagraphs.watching("rollout step"):
        compile_a_graph()
    with cudagraphs.watching("rollout step"):
        record_a_cuda_graph()
    report = cudagraphs.reports()["rollout step"]
    assert report.captured and report.decided and report.calls == 2
    assert report.describe() == "rollout step: captured (1 CUDA graph of 1 graph)"
    with cudagraphs.watching("update step"):
        record_a_cuda_graph(non_static_inputs=12)
    assert cudagraphs.reports()["update step"].describe() == (
        "update step: captured (1 CUDA graph of 0 graphs; 12 inputs copied in per replay)"
    )


def test_a_skip_names_torchs_reason_and_the_line():
    with cudagraphs.watching("rollout step"):
        compile_a_graph()
        log_cudagraph_skip_and_bump_counter(MUTATION)
        record_a_cuda_graph()  # another graph of the same function was recorded: still not captured as a whole
    report = cudagraphs.reports()["rollout step"]
    assert report.decided and not report.captured and report.skips == [MUTATION]
    assert report.describe() == (
        "rollout step: not captured (1 of its graphs skipped): mutated inputs (2 instances)"
        ' (at File "/src/marl/core/rollout.py", line 88, in update)'
    )


def test_what_happens_outside_a_watched_call_is_nobodys():
    log_cudagraph_skip_and_bump_counter(MUTATION)
    record_a_cuda_graph()
    with cudagraphs.watching("update step"):
        pass
    report = cudagraphs.reports()["update step"]
    assert (report.recorded, report.skips, report.silent_skips, report.decided) == (0, [], 0, False)
    assert report.describe() == "update step: not recorded yet (1 call, 0 graphs)"


def test_a_skip_torch_counts_without_a_reason_is_counted_apart():
    from torch._dynamo.utils import counters

    with cudagraphs.watching("update step"):
        counters["inductor"]["cudagraph_skips"] += 1  # torch's way for a graph holding no CUDA op
        record_a_cuda_graph()
    report = cudagraphs.reports()["update step"]
    assert report.captured and report.silent_skips == 1
    assert report.describe() == "update step: captured (1 CUDA graph of 0 graphs; 1 without a CUDA op not recorded)"


def test_the_watch_survives_a_dynamo_reset():
    # `torch._dynamo.reset()` drops every callback: the watcher hooks on again at the next watched call.
    with cudagraphs.watching("update step"):
        pass
    torch._dynamo.reset()
    with cudagraphs.watching("update step"):
        record_a_cuda_graph()
    assert cudagraphs.reports()["update step"].recorded == 1


def test_maybe_compile_for_cuda_watches_every_call():
    # Compiled for CUDA and called with CPU tensors: torch compiles the graph, then leaves it unrecorded
    # (no CUDA op) without logging a reason; the real path through torch.compile and Inductor.
    torch._dynamo.reset()
    step = envs.compile.maybe_compile(lambda x: x.sin() + 1, True, torch.device("cuda"), name="update step")
    for _ in range(3):
        step(torch.ones(4))
    report = cudagraphs.reports()["update step"]
    assert report.calls == 3 and report.graphs == 1 and report.silent_skips == 1
    assert report.recorded == 0 and not report.captured


def test_a_compile_failure_is_reported_as_a_fallback(monkeypatch):
    monkeypatch.setattr(envs.compile, "_warned", True)  # the fallback warning is tested elsewhere

    def broken_compile(fn, **options):
        def compiled(*args):
            raise RuntimeError("Inductor failed\nat some frame")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    step = envs.compile.maybe_compile(lambda x: x + 1, True, torch.device("cuda"), name="update step")
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))  # run eagerly
    report = cudagraphs.reports()["update step"]
    assert report.decided and not report.captured
    assert report.describe().startswith(
        "update step: not captured: the compile failed and it runs eagerly (RuntimeError: Inductor failed "
        f"(raised at {__file__}:"
    )


class InductorError(RuntimeError):
    """Named as torch's: the error Inductor raises when it fails."""


def test_an_inductor_failure_on_cuda_is_compiled_again_without_loop_reordering(monkeypatch):
    # torch issue 176591: Inductor's loop reordering after fusion asserts on the fused update step's
    # graph on CUDA. The first compile fails like that; the retry gets the options that avoid it.
    compiles = []

    def compile_failing_first(fn, **options):
        compiles.append(options)
        first = len(compiles) == 1

        def compiled(*args):
            if first:
                raise InductorError("AssertionError: ")
            record_a_cuda_graph()
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", compile_failing_first)
    step = envs.compile.maybe_compile(lambda x: x + 1, True, torch.device("cuda"), name="update step")
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))
    assert compiles[0]["mode"] == "reduce-overhead"
    assert compiles[1]["options"] == {"triton.cudagraphs": True, "loop_ordering_after_fusion": False}
    report = cudagraphs.reports()["update step"]
    assert report.captured and report.fallback is None
    assert "compiled again without loop reordering after InductorError: AssertionError" in report.describe()
    step(torch.ones(2))
    assert len(compiles) == 2  # no third compile


def test_an_error_that_is_not_inductors_is_not_retried(monkeypatch):
    monkeypatch.setattr(envs.compile, "_warned", True)
    compiles = []

    def broken_compile(fn, **options):
        compiles.append(options)

        def compiled(*args):
            raise RuntimeError("dynamo cannot trace this")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    step = envs.compile.maybe_compile(lambda x: x + 1, True, torch.device("cuda"), name="update step")
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))  # eagerly, after one compile
    assert [c.get("mode") for c in compiles] == ["reduce-overhead", None]  # the retry was built, never called
    assert cudagraphs.reports()["update step"].fallback.startswith("RuntimeError: dynamo cannot trace this")


class WrappingError(RuntimeError):
    """Like torch's InductorError: the original error kept as `inner_exception`."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(f"AssertionError: {inner}")
        self.inner_exception = inner


def fail_deep_inside():
    raise AssertionError  # bare, as compilers' failed asserts often are


def test_a_bare_compiler_assertion_is_described_by_where_it_was_raised():
    try:
        try:
            fail_deep_inside()
        except AssertionError as inner:
            raise WrappingError(inner) from None
    except WrappingError as error:
        described = cudagraphs.describe_error(error)
    line = fail_deep_inside.__code__.co_firstlineno + 1
    assert described == f"WrappingError: AssertionError (raised at {__file__}:{line} in fail_deep_inside)"


def test_a_graph_break_is_named_and_announced_as_a_warning():
    def broken(x):
        x = x * 2
        torch._dynamo.graph_break()
        return x + 1

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with cudagraphs.watching("rollout step"):
        torch.compile(broken, backend="eager")(torch.ones(3))
        record_a_cuda_graph()
        record_a_cuda_graph()
    report = cudagraphs.reports()["rollout step"]
    assert report.captured and report.graphs == 2 and len(report.breaks) == 1
    assert report.describe().startswith("rollout step: captured (2 CUDA graphs of 2 graphs; graph breaks: ")
    with pytest.warns(RuntimeWarning, match=r"graph breaks: .*one more replay's host overhead$"):
        assert cudagraphs.announce({"rollout step"}) == set()


def test_announce_prints_the_captured_warns_for_the_skipped_and_keeps_the_undecided(capsys):
    with cudagraphs.watching("rollout step"):
        record_a_cuda_graph()
    with cudagraphs.watching("update step"):
        log_cudagraph_skip_and_bump_counter(MUTATION)
    with pytest.warns(RuntimeWarning, match=r"^CUDA graphs: update step: not captured .*mutated inputs"):
        pending = cudagraphs.announce({"rollout step", "update step", "other step"})
    assert pending == {"other step"}
    assert capsys.readouterr().out == "CUDA graphs: rollout step: captured (1 CUDA graph of 0 graphs)\n"
