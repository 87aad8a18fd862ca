"""Progress display on stderr (rich), so stdout keeps only the build summary."""
from __future__ import annotations

import contextlib
import io


class Progress:
    """Thin wrapper over rich.progress: `with p.task("calibrating", total=n) as advance: advance(1)`."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._rich = None
        if enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress as RichProgress,
                                       SpinnerColumn, TextColumn, TimeElapsedColumn)

            self._console = Console(stderr=True)
            self._cols = dict(spinner=SpinnerColumn(), text=TextColumn("{task.description:<28}"), bar=BarColumn(),
                              count=MofNCompleteColumn(), bytes=DownloadColumn(), time=TimeElapsedColumn())
            self._factory = RichProgress

    def log(self, message: str) -> None:
        if self.enabled:
            self._console.print(message, highlight=False, markup=False, soft_wrap=True)

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None, unit: str = "count"):
        if not self.enabled:
            yield lambda n=1: None
            return
        c = self._cols
        cols = [c["spinner"], c["text"], c["bar"], c["bytes"] if unit == "bytes" else c["count"], c["time"]]
        if total is None:
            cols = [c["spinner"], c["text"], c["time"]]
        with self._factory(*cols, console=self._console, transient=False) as p:
            tid = p.add_task(description, total=total)
            yield lambda n=1: p.advance(tid, n)
            if total is None:
                p.update(tid, total=1, completed=1)
            else:
                p.update(tid, completed=total)


def quiet_stdout():
    """ModelOpt prints its own chatter (whole quant configs) on stdout: keep it off the build's output."""
    return contextlib.redirect_stdout(io.StringIO())
