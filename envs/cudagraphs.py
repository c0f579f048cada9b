"""Whether the CUDA graphs of a compiled function were captured, and if not, why: read from torch itself.

On CUDA, `envs.compile.maybe_compile` compiles with `mode="reduce-overhead"`, which records each graph
torch.compile makes as a CUDA graph (on its second call: the first one warms up) and replays it, so a
step costs one launch instead of one per kernel. torch skips the recording when it cannot replay a
graph safely, most often because the graph mutates an input whose address is not fixed ("mutated
inputs"), and says so only in a log line. `maybe_compile` watches every call of a function it compiled
for CUDA (`watching(name)`) and collects here, per name:

- the graphs compiled: dynamo's count of unique graphs (`counters["stats"]["unique_graphs"]`);
- the CUDA graphs recorded: the `CUDAGRAPH_RECORDING` callbacks of dynamo's callback handler, which
  torch's cudagraph trees run around every recording;
- the skips: every skip goes through `torch._inductor.cudagraph_utils.log_cudagraph_skip_and_bump_counter`,
  which logs the reason ("skipping cudagraphs due to ...") as a warning on that module's `cudagraphs`
  artifact logger (`perf_hints` up to torch 2.10, off by default there: nothing was printed) and bumps
  `counters["inductor"]["cudagraph_skips"]`; a bump without a logged reason is counted too;
- a compile failure, after which the function runs eagerly (`fallback`);
- dynamo's graph breaks (`counters["graph_break"]`, by reason), which split it into several graphs;
- the inputs of its recorded graphs that are not static (`counters["inductor"]
  ["cudagraph_recorded_non_static_inputs"]`): each replay first copies them into the graph's own
  buffers, which costs as much as reading them again.

A graph that mutates an input is recorded only if that input is static (a parameter, or marked with
`torch._dynamo.mark_static_address`: its address never changes, so a replay writes where the caller
reads). `mark_static` marks what a compiled step writes in place.

`reports()` hands them out; `announce(names)` prints those decided (a warning for each not captured or
broken into several graphs):
`marl train --compile` on CUDA calls it after every iteration until the rollout step's and the update
step's are announced.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Where torch logs its skips: `getArtifactLogger("torch._inductor.cudagraph_utils", "cudagraphs")`, and
# "perf_hints" before torch 2.11. Its skip messages start so (`format_default_skip_message` and the others).
SKIP_LOGGERS = ("torch._inductor.cudagraph_utils.__cudagraphs", "torch._inductor.cudagraph_utils.__perf_hints")
SKIP_MESSAGES = ("skipping cudagraph", "disabling cudagraph")


@dataclass
class GraphReport:
    """What the calls of one compiled function (or of several under one name) did about CUDA graphs."""

    name: str
    calls: int = 0
    graphs: int = 0
    """Graphs torch.compile made of it (more than one where it breaks the graph)."""
    recorded: int = 0
    """CUDA graphs recorded."""
    skips: list[str] = field(default_factory=list)
    """torch's reasons for each graph it did not record, in the order given."""
    silent_skips: int = 0
    """Graphs torch did not record and gave no reason for: it does so for a graph without a CUDA op."""
    fallback: str | None = None
    """The compile error after which it runs eagerly."""
    copied_inputs: int = 0
    """Inputs of its recorded graphs that are not static: copied in before every replay."""
    retried: str | None = None
    """The compile error after which it was compiled again without loop reordering (`envs.compile`)."""
    breaks: list[str] = field(default_factory=list)
    """Dynamo's reasons for each graph break: each splits the function into one more graph, each graph
    a CUDA graph replayed with its own host overhead."""

    @property
    def decided(self) -> bool:
        """Whether its fate is known: a graph recorded, skipped, or the compile failed (before that, torch
        is still compiling or warming up)."""
        return bool(self.recorded or self.skips or self.fallback)

    @property
    def captured(self) -> bool:
        return self.recorded > 0 and not self.skips and self.fallback is None

    def describe(self) -> str:
        """One line: `update step: captured (1 graph)`, or what was not captured and why."""
        if self.fallback is not None:
            return f"{self.name}: not captured: the compile failed and it runs eagerly ({self.fallback})"
        if self.skips:
            reasons = "; ".join(dict.fromkeys(_short(reason) for reason in self.skips))
            return f"{self.name}: not captured ({len(self.skips)} of its graphs skipped): {reasons}"
        if self.recorded:
            silent = f"; {self.silent_skips} without a CUDA op not recorded" if self.silent_skips else ""
            copied = f"; {_count(self.copied_inputs, 'input')} copied in per replay" if self.copied_inputs else ""
            of = f"{_count(self.recorded, 'CUDA graph')} of {_count(self.graphs, 'graph')}{silent}{copied}"
            retried = f"; compiled again without loop reordering after {self.retried}" if self.retried else ""
            breaks = f"; graph breaks: {'; '.join(dict.fromkeys(self.breaks))}" if self.breaks else ""
            return f"{self.name}: captured ({of}{retried}{breaks})"
        return f"{self.name}: not recorded yet ({_count(self.calls, 'call')}, {_count(self.graphs, 'graph')})"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _short(reason: str) -> str:
    """torch's reason without its stack trace, but with the innermost line it names (where the mutation is)."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    head = lines[0].removeprefix("skipping cudagraphs due to ").rstrip(".")
    head = head.split(". Found from")[0].rstrip(" :")
    files = [line for line in lines[1:] if line.startswith("File ")]
    return f"{head} (at {files[-1]})" if files else head


_reports: dict[str, GraphReport] = {}
_current = threading.local()  # .report: the report of the compiled call running on this thread, if any


def mark_static(tensors: Iterable[torch.Tensor], device: torch.device) -> None:
    """On CUDA, mark `tensors` (which a compiled step updates in place, and which keep their address for
    the whole run) static, so torch records the step's CUDA graph; elsewhere nothing: only CUDA graphs
    replay on fixed addresses."""
    if device.type == "cuda":
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)


def reports() -> dict[str, GraphReport]:
    """Every watched name's report so far."""
    return dict(_reports)


def clear() -> None:
    """Forget every report (a new run, a test)."""
    _reports.clear()


def announce(names: set[str]) -> set[str]:
    """Print `CUDA graphs: <report>` for each of `names` that was captured, warn for each that was not
    (naming torch's reasons); returns the names not decided yet (still compiling or warming up)."""
    pending = set()
    for name in sorted(names):
        watched = _reports.get(name)
        if watched is None or not watched.decided:
            pending.add(name)
        elif watched.captured and watched.breaks:
            warnings.warn(
                f"CUDA graphs: {watched.describe()}; each graph break costs one more replay's host overhead",
                RuntimeWarning,
                stacklevel=2,
            )
        elif watched.captured:
            print(f"CUDA graphs: {watched.describe()}")
        else:
            warnings.warn(
                f"CUDA graphs: {watched.describe()}; its kernels are launched one by one", RuntimeWarning, stacklevel=2
            )
    return pending


def report(name: str) -> GraphReport:
    return _reports.setdefault(name, GraphReport(name))


def record_fallback(name: str, error: BaseException) -> None:
    """`name`'s compile failed with `error`; it runs eagerly from now on."""
    report(name).fallback = describe_error(error)


def record_retry(name: str, error: BaseException) -> None:
    """`name`'s compile failed with `error`; it is compiled again with other options."""
    report(name).retried = describe_error(error)


def describe_error(error: BaseException) -> str:
    """`Type: first line of the message`, and where the innermost error it wraps was raised: compiler
    errors often carry no message (an `InductorError` around a bare `AssertionError`), and then only the
    place names the failure."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    text = f"{type(error).__name__}: {first_line}".rstrip(": ")
    inner, seen = error, {id(error)}
    while True:  # torch's InductorError keeps the original as `inner_exception`, others chain it
        nested = getattr(inner, "inner_exception", None) or inner.__cause__ or inner.__context__
        if not isinstance(nested, BaseException) or id(nested) in seen:
            break
        inner = nested
        seen.add(id(inner))
    frames = traceback.extract_tb(inner.__traceback__)
    if frames:
        frame = frames[-1]
        path = Path(frame.filename)
        where = "/".join(path.parts[-3:]) if "site-packages" in path.parts else str(path)
        text += f" (raised at {where}:{frame.lineno} in {frame.name})"
    return text


class _SkipHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        watched = getattr(_current, "report", None)
        if watched is not None and record.getMessage().startswith(SKIP_MESSAGES):
            watched.skips.append(record.getMessage())


_handler = _SkipHandler()


def _on_start(args) -> None:
    from torch._dynamo.callback import CallbackTrigger

    watched = getattr(_current, "report", None)
    if watched is not None and args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
        watched.recorded += 1


def _install() -> None:
    """Hook onto torch's skip log and recording callbacks (again after `torch._dynamo.reset()`, which
    drops every callback)."""
    for name in SKIP_LOGGERS:
        logger = logging.getLogger(name)
        if _handler not in logger.handlers:
            logger.addHandler(_handler)
    handler = torch._dynamo.callback_handler
    if _on_start not in handler.start_callbacks:
        handler.register_start_callback(_on_start)


@contextlib.contextmanager
def watching(name: str) -> Iterator[GraphReport]:
    """Attribute to `name` what torch compiles, records and skips inside the block (one call of the
    compiled function). Host-side bookkeeping only: no device work, no sync."""
    from torch._dynamo.utils import counters

    _install()
    watched = report(name)
    outer = getattr(_current, "report", None)
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    copied = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
    breaks = dict(counters["graph_break"])
    logged = len(watched.skips)
    _current.report = watched
    try:
        yield watched
    finally:
        _current.report = outer
        watched.calls += 1
        watched.graphs += counters["stats"]["unique_graphs"] - graphs
        watched.copied_inputs += counters["inductor"]["cudagraph_recorded_non_static_inputs"] - copied
        unlogged = counters["inductor"]["cudagraph_skips"] - skips - (len(watched.skips) - logged)
        watched.silent_skips += max(unlogged, 0)
        for reason, count in counters["graph_break"].items():
            watched.breaks += [reason.splitlines()[0]] * (count - breaks.get(reason, 0))
