"""``sluice events`` and ``sluice status --watch``: the live feed (SPEC §9.3) in a
terminal.

``events`` prints one line per frame (:func:`proxy.cli.lines.frame_line`), or with
``--json`` each frame as the gateway sent it, one per line. ``status --watch`` draws what
``sluice status`` prints from the ``hello`` frame and draws it again as events change it
(:class:`proxy.cli.view.WatchView`), at most ``REDRAWS_PER_SECOND`` times a second, fetching
the status over the admin API when an event (or ``resync``) asks for it.

Both end with exit 0 when the user presses Ctrl-C or the gateway stops (it closes the feed
with 1001: "gateway stopped"), and 1 when the feed cannot be opened or is lost (the reason
on stderr). A reader of stdout that goes away (``| head``) ends them quietly with 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TextIO

import trio

from proxy.cli.admin import CliError, fetch_status
from proxy.cli.feed import Ending, follow
from proxy.cli.lines import FEED_TYPES, frame_line
from proxy.cli.view import WatchView, screen
from proxy.datadir import read_state

__all__ = ["REDRAWS_PER_SECOND", "events_main", "watch_main"]

REDRAWS_PER_SECOND = 4


def _frame(text: str) -> dict[str, Any] | None:
    """A frame of the feed, or None (with a word on stderr) when it is not one."""
    try:
        frame = json.loads(text)
    except ValueError:
        frame = None
    if not isinstance(frame, dict):
        print(f"sluice: skipped a frame that is not a JSON object ({len(text)} characters)",
              file=sys.stderr)
        return None
    return frame


def _write(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()  # a pipe (| jq, | grep) sees each line as it comes


def _run(data_dir: Path, as_json: bool, body: Callable[..., Any], *args: Any) -> int:
    """Run one live command (``body(state, *args)`` under trio, returning its Ending) and
    turn how it ended into the exit code."""
    state = read_state(data_dir)
    if state is None:
        print(f"sluice: no gateway is running for {data_dir}", file=sys.stderr)
        return 1
    try:
        ending: Ending = trio.run(body, state, *args)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _drop_stdout()
        return 0
    try:
        if ending.how == "stopped":
            # With --json stdout holds frames only; the word goes to stderr.
            print(ending.message(), file=sys.stderr if as_json else sys.stdout, flush=True)
        elif not ending.ok:
            print(f"sluice: {ending.message()}", file=sys.stderr)
    except BrokenPipeError:
        _drop_stdout()
    return 0 if ending.ok else 1


def _drop_stdout() -> None:
    """stdout's reader is gone: point it at /dev/null so the exit flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# -------------------------------------------------------------------------- sluice events


def events_main(data_dir: Path, *, as_json: bool = False,
                types: Collection[str] | None = None) -> int:
    """``sluice events [--json] [--types a,b]``: ``types`` None shows every frame; else
    the frames of those types, and (without ``--json``) ``hello`` and ``resync`` always,
    since they say what the feed itself does."""
    shown = None if types is None else frozenset(types) | (
        frozenset() if as_json else frozenset(FEED_TYPES))

    def on_text(text: str) -> None:
        frame = _frame(text)
        if frame is None or (shown is not None and frame.get("type") not in shown):
            return
        if as_json:
            line = text if "\n" not in text else json.dumps(frame, separators=(",", ":"))
        else:
            line = frame_line(frame)
        _write(sys.stdout, line + "\n")

    async def body(state: Any) -> Ending:
        return await follow(state, data_dir, on_text)

    return _run(data_dir, as_json, body)


# -------------------------------------------------------------------- sluice status --watch


class _Flag:
    """Set any number of times; the one waiter clears it when it wakes."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def __repr__(self) -> str:
        return f"_Flag(set={self._event.is_set()})"

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


def watch_main(data_dir: Path, *, as_json: bool = False, out: TextIO | None = None) -> int:
    """``sluice status --watch [--json]``: with ``--json`` each new status document as one
    line of JSON, else the text of ``sluice status``, on a terminal in place."""
    stream = out if out is not None else sys.stdout
    tty = stream.isatty()
    view = WatchView()
    redraw, refetch = _Flag(), _Flag()
    shown: list[str | None] = [None]

    def draw() -> None:
        if view.status is None:
            return
        if as_json:
            text = json.dumps(view.status, separators=(",", ":"))
            if text != shown[0]:
                _write(stream, text + "\n")
                shown[0] = text
            return
        text = view.text()
        footer = f"updated {time.strftime('%H:%M:%S')}; Ctrl-C to stop"
        written = screen(text, shown[0], tty=tty, footer=footer)
        if written is not None:
            _write(stream, written)
            shown[0] = text

    def on_text(text: str) -> None:
        frame = _frame(text)
        if frame is None:
            return
        change = view.apply(frame)
        if change.redraw:
            redraw.set()
        if change.refetch:
            refetch.set()

    async def drawer() -> None:
        while True:
            await redraw.wait()
            draw()
            await trio.sleep(1 / REDRAWS_PER_SECOND)

    async def fetcher() -> None:
        while True:
            await refetch.wait()
            if view.status is None:
                continue  # before hello there is nothing to refresh
            view.fetch_started()
            status: Mapping[str, Any] | None
            try:
                status = await trio.to_thread.run_sync(fetch_status, data_dir,
                                                       abandon_on_cancel=True)
                error = None
            except CliError as exc:
                status, error = None, str(exc)
            if view.fetch_done(dict(status) if status is not None else None, error):
                refetch.set()
            redraw.set()

    async def body(state: Any) -> Ending:
        ending = await follow(state, data_dir, on_text, helpers=(drawer, fetcher))
        draw()  # what came in the last fraction of a second
        return ending

    return _run(data_dir, as_json, body)
