"""Training progress as users watch it: a progress bar in a console or a Jupyter notebook, log
lines elsewhere, and train / validation scalars for TensorBoard.

The engine reports to a :class:`ProgressReporter`, which fans out to the sinks chosen for the
run. A console bar is drawn on ``stderr`` only when it is a terminal; in a notebook the bar is an
HTML ``<progress>`` element updated in place. Where no bar is drawn (``spark-submit`` logging to a
file, CI, or the bar turned off: ``progress_bar=False`` on :class:`~sparkdl.DistriOptimizer`,
``progressBar=False`` on the estimators), :class:`ProgressLog` writes the bar's text as INFO
lines of the ``sparkdl.progress`` logger at a bounded rate: one at every tenth of an epoch (its last iteration
included) and one after 30 s without a line, never one per iteration. Every iteration's numbers
stay in the run's summary and in a DEBUG line of the ``sparkdl`` logger.

Example::

    opt = DistriOptimizer(..., progress_bar=True)
    opt.set_tensorboard("/tmp/tb/run1")      # needs the tensorboard package
    opt.optimize()
"""

from __future__ import annotations

import html
import logging
import sys
import time
from typing import Any, Sequence, TextIO

from ....errors import InvalidArgumentError
from .summary import IterationRecord, ValidationRecord

__all__ = ["ProgressReporter", "ConsoleBar", "NotebookBar", "ProgressLog", "TensorBoardSink",
           "check_tensorboard", "in_notebook"]

progress_log = logging.getLogger("sparkdl.progress")


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) kernel."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - IPython not initialised
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def check_tensorboard(log_dir: str) -> Any:
    """torch's ``SummaryWriter`` class, or a clear error when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise InvalidArgumentError(
            "TensorBoard summaries need the tensorboard package: pip install tensorboard "
            f"(asked to write to {log_dir!r}).") from exc
    return SummaryWriter


def _duration(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _Bar:
    """What both bars show: epoch, iteration within the epoch, loss, samples/s, ETA."""

    def __init__(self, iterations_per_epoch: int, total_iterations: int | None,
                 start_iteration: int) -> None:
        self.per_epoch = iterations_per_epoch
        self.total = total_iterations
        self.start_iteration = start_iteration
        self.started = time.perf_counter()
        self.last_validation = ""

    def validation(self, record: ValidationRecord) -> None:
        self.last_validation = ", ".join(f"{k} {v:.4g}" for k, v in record.metrics.items())

    def text(self, record: IterationRecord) -> tuple[str, int]:
        step = (record.iteration - 1) % self.per_epoch + 1
        done = record.iteration - self.start_iteration
        eta = ""
        if self.total is not None and done > 0:
            left = self.total - record.iteration
            eta = f"  eta {_duration(left * (time.perf_counter() - self.started) / done)}"
        epochs = f"/{-(-self.total // self.per_epoch)}" if self.total is not None else ""
        line = (f"epoch {record.epoch}{epochs} {step}/{self.per_epoch}  loss {record.loss:.4g}  "
                f"{record.samples_per_s:,.0f} samples/s{eta}")
        if self.last_validation:
            line += f"  | {self.last_validation}"
        return line, step


class ConsoleBar(_Bar):
    """A one-line bar redrawn with carriage returns; a newline closes each epoch."""

    width = 24

    def __init__(self, iterations_per_epoch: int, total_iterations: int | None,
                 start_iteration: int, stream: TextIO | None = None) -> None:
        super().__init__(iterations_per_epoch, total_iterations, start_iteration)
        self.stream = stream if stream is not None else sys.stderr
        self.line_open = False

    def iteration(self, record: IterationRecord) -> None:
        line, step = self.text(record)
        filled = self.width * step // self.per_epoch
        bar = "#" * filled + "-" * (self.width - filled)
        end = "\n" if step == self.per_epoch else ""
        self.stream.write(f"\r[{bar}] {line}\x1b[K{end}")
        self.stream.flush()
        self.line_open = not end

    def close(self) -> None:
        if self.line_open:
            self.stream.write("\n")
            self.stream.flush()


class NotebookBar(_Bar):
    """An HTML ``<progress>`` element in the cell's output, updated in place."""

    def __init__(self, iterations_per_epoch: int, total_iterations: int | None,
                 start_iteration: int) -> None:
        super().__init__(iterations_per_epoch, total_iterations, start_iteration)
        from IPython.display import HTML, display

        self._html = HTML
        self.handle = display(HTML("<code>sparkdl: starting</code>"), display_id=True)

    def iteration(self, record: IterationRecord) -> None:
        line, step = self.text(record)
        self.handle.update(self._html(
            f"<progress value='{step}' max='{self.per_epoch}' style='width:40%'></progress> "
            f"<code>{html.escape(line)}</code>"))

    def close(self) -> None:
        pass


class ProgressLog(_Bar):
    """The bar's text as INFO lines of the ``sparkdl.progress`` logger, for logs that are not
    a terminal: a line when an iteration reaches the next tenth of its epoch (so the epoch's
    last iteration always has one), or when ``quiet_s`` seconds passed since the last line (a
    slow epoch still shows it is alive). At most ten lines per epoch plus one per ``quiet_s``;
    the validations have lines of their own.

    Example: ``ProgressLog(235, 235, 0)`` logs iterations 24, 47, 71, ... 212 and 235.
    """

    tenths = 10

    def __init__(self, iterations_per_epoch: int, total_iterations: int | None,
                 start_iteration: int, quiet_s: float = 30.0) -> None:
        super().__init__(iterations_per_epoch, total_iterations, start_iteration)
        self.quiet_s = quiet_s
        self.last_line = time.perf_counter()

    def due(self, step: int) -> bool:
        """Whether iteration ``step`` (1-based, within its epoch) ends a tenth of the epoch."""
        return step * self.tenths // self.per_epoch > (step - 1) * self.tenths // self.per_epoch

    def iteration(self, record: IterationRecord) -> None:
        line, step = self.text(record)
        now = time.perf_counter()
        if self.due(step) or now - self.last_line >= self.quiet_s:
            self.last_line = now
            progress_log.info("%s", line)

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Writes ``train/loss``, ``train/learning_rate``, ``train/samples_per_s`` per iteration
    and ``validation/<metric>`` per validation, with the iteration as the step, through
    ``torch.utils.tensorboard`` (needs the ``tensorboard`` package).

    Example: ``TensorBoardSink("/tmp/tb/run1")`` then ``tensorboard --logdir /tmp/tb``.
    """

    def __init__(self, log_dir: str) -> None:
        self.writer = check_tensorboard(log_dir)(log_dir=log_dir)

    def iteration(self, record: IterationRecord) -> None:
        self.writer.add_scalar("train/loss", record.loss, record.iteration)
        self.writer.add_scalar("train/learning_rate", record.learning_rate, record.iteration)
        self.writer.add_scalar("train/samples_per_s", record.samples_per_s, record.iteration)

    def validation(self, record: ValidationRecord) -> None:
        for name, value in record.metrics.items():
            self.writer.add_scalar(f"validation/{name}", value, record.iteration)

    def close(self) -> None:
        self.writer.close()


class ProgressReporter:
    """The sinks of one run: a bar (console or notebook, when asked and possible) or else
    :class:`ProgressLog`'s bounded log lines, an optional TensorBoard writer, and
    ``listeners`` that the caller owns (fed the same records, never closed here; e.g.
    :class:`sparkdl.engine.fit.reports.mlflow_tracking.MlflowTracker`).

    ``progress_bar``: True always draws a bar (in the notebook when in one, else on ``stderr``),
    False never does, None draws one only when interactive (a notebook or a terminal).
    """

    def __init__(self, progress_bar: bool | None, tensorboard_dir: str | None,
                 iterations_per_epoch: int, total_iterations: int | None,
                 start_iteration: int, stream: TextIO | None = None,
                 listeners: Sequence[Any] = ()) -> None:
        self.sinks: list[Any] = []
        self.listeners = list(listeners)
        self.console = False
        stream = stream if stream is not None else sys.stderr
        if progress_bar is not False:
            if in_notebook():
                self.sinks.append(NotebookBar(iterations_per_epoch, total_iterations,
                                              start_iteration))
            elif progress_bar or _is_terminal(stream):
                self.sinks.append(ConsoleBar(iterations_per_epoch, total_iterations,
                                             start_iteration, stream))
                self.console = True
        if not self.sinks:
            self.sinks.append(ProgressLog(iterations_per_epoch, total_iterations,
                                          start_iteration))
        if tensorboard_dir:
            self.sinks.append(TensorBoardSink(tensorboard_dir))

    def iteration(self, record: IterationRecord) -> None:
        for sink in self.sinks + self.listeners:
            sink.iteration(record)

    def validation(self, record: ValidationRecord) -> None:
        for sink in self.sinks + self.listeners:
            sink.validation(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
