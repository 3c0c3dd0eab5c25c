"""A model download's progress for a person: a rich progress bar on a terminal, else a log line
every few seconds (a bar redrawn into a log file is noise)."""

from __future__ import annotations

import logging

import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from trexo.availability import describe_download
from trexo.hub.downloads import Downloads
from trexo.types.downloads import DownloadPhase, DownloadProgress

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0
ENDED = (DownloadPhase.DONE, DownloadPhase.FAILED)


async def show_download(downloads: Downloads, model_id: str, console: Console) -> None:
    """Follow this node's download of `model_id` (from whenever it starts) until it ends."""
    if console.is_terminal:
        await _bar(downloads, model_id, console)
    else:
        await _log_lines(downloads, model_id)


async def _next(downloads: Downloads, model_id: str, at_most: float) -> DownloadProgress | None:
    """The progress after the next change, or after `at_most` seconds (to redraw the rate)."""
    with trio.move_on_after(at_most):
        await downloads.wait_change()
    return downloads.progress(model_id)


async def _bar(downloads: Downloads, model_id: str, console: Console) -> None:
    progress = downloads.progress(model_id)
    while progress is None:
        progress = await _next(downloads, model_id, 1.0)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(model_id, total=None, note="")
        while True:
            note = ""
            if progress.phase is DownloadPhase.RETRYING:
                note = f"retrying in {progress.retry_in or 0:.0f} s: {progress.error}"
            bar.update(
                task,
                completed=progress.done_bytes,
                total=progress.total_bytes or None,
                note=note,
            )
            if progress.phase in ENDED:
                break
            progress = await _next(downloads, model_id, 1.0) or progress
    if progress.phase is DownloadPhase.FAILED:
        console.print(f"[red]download of {model_id} failed:[/red] {progress.error}")


async def _log_lines(downloads: Downloads, model_id: str) -> None:
    while True:
        progress = await _next(downloads, model_id, LOG_EVERY_S)
        if progress is None:
            continue
        if progress.phase in ENDED:
            return  # the downloads service logs how it ended
        log.info("downloading %s: %s", model_id, describe_download(progress))
