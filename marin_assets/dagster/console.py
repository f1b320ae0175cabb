"""A quiet terminal for runs started from the command line: about a screen, not a thousand DEBUG lines.

A run's record is its event log in the Dagster instance (and the UI); what a person watches in the
terminal is much less: which asset started, whether it computed or was a cache hit and in how long,
the training loss as it falls, what failed and why. Left alone, the terminal gets everything: Dagster's
console logger prints every event at DEBUG, the steps' own lines relayed from Ray come with it, and
Ray, JAX and Levanter print their start-up messages and warnings.

`quiet_console` sends everything this process and the processes it starts write to file descriptors 1
and 2 into a log file — exactly what `--verbose` prints — and hands back the terminal; `RunPresenter`
turns a run's events (`DagsterInstance.add_event_listener`, called as each event is stored) into the
few lines written there. `materialize_quietly` runs Dagster's own execution of the asset job in this
process with it (`execute_in_process`, as `marin-assets tick` runs a sensor's requests): the run, its
events and materializations are recorded in the instance like those of `dagster asset materialize`, and
the UI shows them. `following` reads the events of runs launched by others (a tick's) as they come.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import dagster as dg

UI_RUNS = "http://127.0.0.1:3000/runs"
"""Where `make dev` (`dagster dev -h 127.0.0.1 -p 3000`) shows a run's whole event log."""

LOSS_LINES = 10
"""Live loss lines per training run at most (besides the last): one per tenth of its steps."""

_TRAIN_PROGRESS = re.compile(r"Progress on:train (\S+)/(\S+) .*?postfix:(.*)$")
"""Levanter's progress bar, logged by tqdm_loggable once a minute when not on a terminal."""
_LOSS_IN_POSTFIX = re.compile(r"\bloss=([-+0-9.eE]+|nan|inf)")
_EVAL_LOSS = re.compile(r"levanter\.eval:? eval loss: ([-+0-9.eE]+|nan|inf)")
"""Levanter's evaluation callback, after each `steps_per_eval` steps."""
_CHECKPOINT_AT = re.compile(r"Saving checkpoint at step (\d+)\.")


def console_log_path(command: str) -> str:
    """Where a quiet command's full output goes: `$DAGSTER_HOME/logs/<command>-<time>-<pid>.log`
    (beside the instance whose event log has the rest), else under the temporary folder."""
    home = os.environ.get("DAGSTER_HOME")
    folder = os.path.join(home, "logs") if home else os.path.join(tempfile.gettempdir(), "marin-assets-logs")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")


def _fd_of(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@contextlib.contextmanager
def quiet_console(log_path: str) -> Iterator[IO[str]]:
    """Send what this process (Python and native code alike) and its children write to stdout and
    stderr into `log_path`; yield a stream to the terminal for the lines meant for a person.

    Redirection is at the file descriptors, so Ray's and JAX's native messages and Dagster's
    console logger (made per run, on `sys.stderr`) land in the file too. Restored on exit, also on an
    exception or Ctrl-C, so its traceback reaches the terminal.
    """
    out_fd = _fd_of(sys.stdout)
    terminal: IO[str]
    if out_fd in (1, 2):
        terminal = open(os.dup(out_fd), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    else:  # stdout is not a file descriptor (a test's capture): write to it as it is
        terminal = sys.stdout
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    saved_fds = [os.dup(1), os.dup(2)]
    saved_streams = sys.stdout, sys.stderr
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        yield terminal
    finally:
        for stream in (sys.stdout, sys.stderr, *saved_streams):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        log.close()
        if terminal is not saved_streams[0]:
            terminal.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def human_seconds(seconds: float) -> str:
    """`0.4 s`, `12.3 s`, `2m 05s`, `1h 02m`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    return f"{minutes // 60}h {minutes % 60:02d}m"


def shown_path(path: str) -> str:
    """A local path relative to the working directory when under it (shorter); anything else as is."""
    if "://" in path or not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _number(text: str) -> float | None:
    """`50`, `50.0it`, `1.20kit` (tqdm's sizes) → a number; `-` → None."""
    found = re.match(r"([-+0-9.eE]+)\s*([kMGT]?)", text)
    if not found:
        return None
    try:
        value = float(found.group(1))
    except ValueError:
        return None
    return value * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[found.group(2)]


def error_lines(error: Any, limit: int = 8) -> list[str]:
    """The cause of a failure as a few lines: the first error in the chain that is not Dagster's own
    wrapper (the step's exception, with its notes), its message cut to `limit` lines."""
    chain: list[Any] = []
    while error is not None and len(chain) < 20:
        chain.append(error)
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    own = next((e for e in chain if not (e.cls_name or "").startswith("Dagster")), chain[0] if chain else None)
    if own is None:
        return []
    text = own.message.strip()
    if own.cls_name:  # `package.module.Error: message` (as Python formats it) → `Error: message`
        text = re.sub(rf"^(?:[\w.]+\.)?{re.escape(own.cls_name)}:", f"{own.cls_name}:", text)
        if not text.startswith(f"{own.cls_name}:"):
            text = f"{own.cls_name}: {text}"
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines in the log)"]
    frame = raising_frame(own, chain)
    if frame:
        lines.append("at " + frame)
    return lines


_FRAME = re.compile(r'^\s*(File "[^"]+", line \d+, in \S+)', re.MULTILINE)


def raising_frame(own: Any, chain: Sequence[Any]) -> str | None:
    """`File "…", line N, in fn` of the line that raised `own`, wherever it ran: a step that failed on a Ray
    worker is re-raised in the Dagster process, whose frames say only where; the worker's traceback, attached
    as the cause (`execution.ray_runner.RemoteTraceback`), says what raised it — its innermost frame."""
    for error in chain[chain.index(own) + 1:]:
        if error.cls_name == "RemoteTraceback":
            frames = _FRAME.findall(error.message or "")
            if frames:
                return frames[-1]
    stack = [m for line in own.stack or () for m in _FRAME.findall(line)]
    return stack[-1] if stack else None


@dataclass
class _Training:
    """What the loss lines of one running step have shown so far."""

    total: float | None = None
    step: float | None = None
    shown_at: dict[str, float] = field(default_factory=dict)
    """The step of the last line shown, per kind (train loss, eval loss)."""


@dataclass
class AssetOutcome:
    """One asset (or partition) of a run, as the terminal reports it."""

    asset: str
    """Asset key, `a/b` form, with `[partition]` for a partition."""
    outcome: str
    """`computed`, `cached` or `failed`."""
    seconds: float
    """From the step's start to its materialization (or failure)."""


@dataclass
class RunPresenter:
    """Turns one run's events into terminal lines, as the events are stored.

    Per asset: `started` when its step does work (its first log line — a cache hit logs nothing),
    then `computed` or `cached` with the seconds since the step started and a headline from its
    result (a training's loss from first to last, an evaluation's loss); a training's loss as it
    falls (Levanter's progress and evaluation lines, at most one per tenth of its steps); a failed
    check; a failure with its cause and where the whole log is. Warnings and errors the steps log
    with `context.log` are shown; their other lines stay in the log.
    """

    out: IO[str]
    log_path: str | None = None
    """The file holding everything the run printed (see `quiet_console`)."""
    started_s: float = field(default_factory=time.monotonic)
    outcomes: list[AssetOutcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Failure lines shown (so a caller can repeat or count them)."""
    run_id: str | None = None
    per_asset: bool = True
    """A line per asset (`started`, then `computed`/`cached`). Off: only failures, failed checks and warnings,
    and `on_run_end` says how the run went (a sensor tick: one line per run)."""
    on_run_end: Callable[[bool, float], None] | None = None
    """Called when the run ends: whether it succeeded, and its seconds."""
    _run_started: float | None = None
    _assets: dict[str, str] = field(default_factory=dict)  # step key → asset key
    _step_started: dict[str, float] = field(default_factory=dict)
    _working: set[str] = field(default_factory=set)
    _training: dict[str, _Training] = field(default_factory=dict)
    _width: int = 24
    _open_started: str | None = None  # on a terminal: the step whose `started` line waits for its outcome

    def print(self, line: str, *, replaces_started_of: str | None = None) -> None:
        """Write a line. On a terminal, an asset's outcome replaces its `started` line when nothing came between."""
        if self._open_started is not None:
            self.out.write("\r\x1b[K" if replaces_started_of == self._open_started else "\n")
            self._open_started = None
        self.out.write(line + "\n")
        self.out.flush()

    def end_line(self) -> None:
        """End a `started` line left open (a run stopped while the step worked), before others write."""
        if self._open_started is not None:
            self.out.write("\n")
            self.out.flush()
            self._open_started = None

    def _started(self, step: str) -> None:
        line = f"  {'started':<9} {'':>8}  {self._assets.get(step, step)}"
        if _is_terminal(self.out):
            self.end_line()
            self.out.write(line)
            self.out.flush()
            self._open_started = step
        else:
            self.print(line)

    def where_logged(self) -> str:
        where = f"{UI_RUNS}/{self.run_id}" if self.run_id else "the Dagster UI's Runs page"
        return (f"full output: {shown_path(self.log_path)}; " if self.log_path else "") + f"events: {where} (make dev)"

    def _asset_of(self, entry: Any) -> str:
        event = entry.dagster_event
        key = getattr(event, "asset_key", None) if event is not None else None
        name = key.to_user_string() if key is not None else self._assets.get(entry.step_key or "", entry.step_key or "")
        partition = getattr(event, "partition", None) if event is not None else None
        return f"{name} [{partition}]" if partition else name

    def _line(self, word: str, seconds: float | None, asset: str, note: str = "", step: str | None = None) -> None:
        took = human_seconds(seconds) if seconds is not None else ""
        self.print(f"  {word:<9} {took:>8}  {asset:<{self._width}}  {note}".rstrip(), replaces_started_of=step)

    def __call__(self, entry: Any) -> None:
        try:
            self._handle(entry)
        except Exception as e:  # noqa: BLE001 - a presenter bug must not fail the run it reports
            self.print(f"  (could not show an event: {type(e).__name__}: {e})")

    def _handle(self, entry: Any) -> None:
        event = entry.dagster_event
        step = entry.step_key or ""
        if event is None:
            self._user_line(step, entry)
            return
        kind = event.event_type
        types = dg.DagsterEventType
        if kind == types.ASSET_MATERIALIZATION_PLANNED and event.asset_key is not None:
            name = event.asset_key.to_user_string()
            self._assets.setdefault(step, name)
            self._width = max(self._width, min(len(name) + 8, 60))
        elif kind == types.STEP_START:
            self._step_started[step] = entry.timestamp
        elif kind == types.RUN_START:
            self._run_started = entry.timestamp
        elif kind == types.ASSET_MATERIALIZATION:
            self._materialized(step, entry)
        elif kind == types.ASSET_CHECK_EVALUATION:
            check = event.event_specific_data
            if check is not None and not check.passed:
                self._line("check", None, self._asset_of(entry),
                           f"{check.check_name} failed: {check.description or ''}".rstrip(": "))
        elif kind == types.STEP_FAILURE:
            asset = self._asset_of(entry)
            seconds = entry.timestamp - self._step_started.get(step, entry.timestamp)
            self.outcomes.append(AssetOutcome(asset, "failed", seconds))
            self._line("FAILED", seconds, asset, step=step)
            self._failure(error_lines(event.step_failure_data.error) or [entry.user_message])
        elif kind == types.RUN_FAILURE and not self.failures:  # failed before or between steps
            data = event.event_specific_data
            self._line("FAILED", None, "the run", entry.user_message.splitlines()[0] if entry.user_message else "")
            self._failure(error_lines(getattr(data, "error", None)) or [entry.user_message])
        if kind in (types.RUN_SUCCESS, types.RUN_FAILURE) and self.on_run_end is not None:
            self.on_run_end(kind == types.RUN_SUCCESS, entry.timestamp - (self._run_started or entry.timestamp))
        elif entry.level >= logging.ERROR and kind not in (types.RUN_FAILURE, types.STEP_FAILURE):
            self._failure([entry.user_message.splitlines()[0] if entry.user_message else str(kind)])

    def _failure(self, lines: Sequence[str]) -> None:
        for line in lines:
            self.print(f"      {line}")
        self.print(f"      {self.where_logged()}")
        self.failures.extend(lines)

    def _materialized(self, step: str, entry: Any) -> None:
        materialization = entry.asset_materialization
        metadata = materialization.metadata if materialization is not None else {}

        def value(key: str) -> Any:
            item = metadata.get(key)
            return getattr(item, "value", None)

        cached = value("cached") is True
        seconds = entry.timestamp - self._step_started.get(step, entry.timestamp)
        asset = self._asset_of(entry)
        self.outcomes.append(AssetOutcome(asset, "cached" if cached else "computed", seconds))
        note = headline(value)
        startup = value("startup_s")
        if not cached and isinstance(startup, (int, float)) and startup >= 1.0:  # Ray starting, a worker spawning
            note = f"{note}  ({human_seconds(startup)} of it start-up)".strip()
        if self.per_asset:
            self._line("cached" if cached else "computed", seconds, asset, note, step=step)
        self._working.discard(step)
        self._training.pop(step, None)

    def _user_line(self, step: str, entry: Any) -> None:
        if not step:
            if entry.level >= logging.WARNING:
                self.print(f"  {logging.getLevelName(entry.level).lower()}: {entry.user_message}")
            return
        if step not in self._working:
            self._working.add(step)
            if self.per_asset:
                self._started(step)
        message = entry.user_message or ""
        if entry.level >= logging.WARNING:
            self.print(f"      {logging.getLevelName(entry.level).lower()}: {message}")
            return
        self._loss_line(step, message)

    def _loss_line(self, step: str, message: str) -> None:
        state = self._training.setdefault(step, _Training())
        if found := _CHECKPOINT_AT.search(message):
            state.step = float(found.group(1))
            return
        kind, loss = None, None
        if found := _TRAIN_PROGRESS.search(message):
            state.step = _number(found.group(1)) if _number(found.group(1)) is not None else state.step
            state.total = _number(found.group(2)) or state.total
            if loss_found := _LOSS_IN_POSTFIX.search(found.group(3)):
                kind, loss = "train loss", float(loss_found.group(1))
        elif found := _EVAL_LOSS.search(message):
            kind, loss = "eval loss", float(found.group(1))
        if kind is None or loss is None or state.total is None:  # an evaluation's own loss is its headline
            return
        last = state.shown_at.get(kind, -math.inf)
        if state.step is not None:  # the progress bar counts steps done; checkpoints (and evaluations) count from 0
            done = state.step >= state.total - (1 if kind == "eval loss" else 0)
            if state.step == last or (not done and state.step - last < state.total / LOSS_LINES):
                return  # the same step again (the final evaluation repeats), or too soon
            state.shown_at[kind] = state.step
        at = "" if state.step is None else f"step {state.step:.0f}/{state.total:.0f}"
        self.print(f"      {at:<14} {kind} {loss:.3f}")

    def summary(self) -> str:
        """`10 assets: 7 computed, 3 cached in 2m 31s` (and failures, when any)."""
        counts = {k: sum(o.outcome == k for o in self.outcomes) for k in ("computed", "cached", "failed")}
        parts = [f"{counts['computed']} computed", f"{counts['cached']} cached"]
        if counts["failed"]:
            parts.append(f"{counts['failed']} FAILED")
        n = len(self.outcomes)
        return (f"{n} asset{'s' if n != 1 else ''}: {', '.join(parts)} in "
                f"{human_seconds(time.monotonic() - self.started_s)}")


def headline(value: Callable[[str], Any]) -> str:
    """The one number worth a glance in a result's metadata: a training's loss from its first step to its last
    (and its final evaluation), an evaluation's loss; empty for other results."""
    final = value("result.final_train_loss")
    table = value("result.loss_curve_table")  # the curve as a table (the plot beside it is an image)
    records = getattr(table, "records", None) or []
    try:
        if records and isinstance(final, (int, float)):
            text = f"train loss {float(records[0].data['value']):.2f} → {final:.2f}"
            evaluated = value("result.final_eval_loss")
            return text + (f", eval {evaluated:.2f}" if isinstance(evaluated, (int, float)) else "")
        for key, label in (("result.final_eval_loss", "eval loss"), ("result.loss", "loss"), ("loss", "loss")):
            found = value(key)
            if isinstance(found, (int, float)) and not isinstance(found, bool):
                return f"{label} {found:.3f}"
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):  # a result of another shape
        return ""
    return ""


@dataclass(frozen=True)
class QuietRun:
    """What `materialize_quietly` ran and how it ended."""

    run_id: str
    """The Dagster run, in the instance (its events in the UI)."""
    success: bool
    """Whether the run succeeded."""
    outcomes: tuple[AssetOutcome, ...]
    """Each asset as reported, in the order they finished."""


def materialize_quietly(defs: dg.Definitions, keys: Sequence[dg.AssetKey], instance: dg.DagsterInstance,
                        presenter: RunPresenter, partition_key: str | None = None,
                        tags: dict[str, str] | None = None) -> QuietRun:
    """Materialize `keys` with Dagster's execution of the definitions' asset job in this process,
    recorded in `instance` like any run, reporting its events to `presenter` as they come."""
    run_id = str(uuid.uuid4())
    presenter.run_id = run_id
    instance.add_event_listener(run_id, presenter)
    job = defs.resolve_implicit_global_asset_job_def()
    try:
        result = job.execute_in_process(instance=instance, asset_selection=list(keys), partition_key=partition_key,
                                        run_id=run_id, tags=tags, raise_on_error=False)
    finally:
        presenter.end_line()
    return QuietRun(run_id, result.success, tuple(presenter.outcomes))


@contextlib.contextmanager
def following(instance: dg.DagsterInstance, tags: dict[str, str], presenter_for: Callable[[str], RunPresenter],
              every_s: float = 0.5) -> Iterator[None]:
    """While the block runs, show the events of each new run with `tags` (runs something else launches, with run
    ids it makes: a sensor tick's) through its own presenter, by reading the instance's event log as the UI does;
    a last read when the block ends, so nothing is missed."""
    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    cursors: dict[str, str | None] = {}
    presenters: dict[str, RunPresenter] = {}
    stop = threading.Event()

    def read() -> None:
        found = instance.get_runs(filters=dg.RunsFilter(tags=tags, created_after=since))
        for run in reversed(found):  # oldest first
            presenter = presenters.setdefault(run.run_id, presenter_for(run.run_id))
            while True:
                page = instance.get_records_for_run(run.run_id, cursor=cursors.get(run.run_id), limit=500)
                for record in page.records:
                    presenter(record.event_log_entry)
                cursors[run.run_id] = page.cursor
                if not page.has_more:
                    break

    def loop() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(Exception):  # a read racing a write: the next read, or the last, shows it
                read()

    thread = threading.Thread(target=loop, name="marin-follow-runs", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        read()


__all__ = ["AssetOutcome", "QuietRun", "RunPresenter", "console_log_path", "error_lines", "following", "headline",
           "human_seconds", "materialize_quietly", "quiet_console", "shown_path"]
