"""A rich progress bar that follows a run's requests, with failures counted as they happen."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from inhouse.bench.requests import RequestRecord


class BarProgress:
    """Implements `inhouse.bench.run.Progress`; use inside `with`."""

    def __init__(self, console: Console) -> None:
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._failed = 0

    def __enter__(self) -> BarProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._bar.stop()

    def begin(self, description: str, total: int | None) -> None:
        """Start a new bar for the phase."""
        self._failed = 0
        self._task = self._bar.add_task(description, total=total, failed=0)

    def advance(self, record: RequestRecord) -> None:
        """Move the bar one request on."""
        if self._task is None:
            return
        self._failed += not record.ok
        self._bar.update(self._task, advance=1, failed=self._failed)
