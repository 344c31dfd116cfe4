"""config.yaml is watched (SPEC §13): hand edits are applied live.

Every :data:`CHECK_EVERY` seconds (and at once on SIGHUP) the watcher compares the file's
signature (device, inode, size, mtime: one ``stat``) with the one the settings last read or
wrote. The gateway's own writes leave the two equal, so they are never read back. A new
signature is not read at once: it must hold for :data:`SETTLE` seconds first, so an editor
that truncates then writes, or writes twice, or renames a temp file over it, is read once,
when it is done; two quick edits make one reload, of the last. SIGHUP means "I am done":
read now. Then :meth:`Settings.reload_file` reads it (between two identical signatures),
parses and validates it exactly as at start and applies it through the same path as a
settings write.

What the user sees (:meth:`ConfigWatcher.report`, also called for what a settings write
found when it took in a hand edit first): a notification ``config_reloaded`` (info) naming
the changed sections and the fields that wait for a restart; ``config_invalid`` (a WARNING
naming the field and the limit) while the file is not valid, the running settings kept;
``config_missing`` while there is no file (or a folder) where config.yaml should be. Both
clear once the file is fine again (fixed, or rewritten by a settings change).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from proxy.files import FileSignature
from proxy.notifications import notify_restart

if TYPE_CHECKING:
    from protocol.config import Config
    from proxy.notifications import Notifications
    from proxy.settings.config_file import Reload
    from proxy.settings.store import Settings

__all__ = ["CHECK_EVERY", "SETTLE", "ConfigWatcher", "Follower"]

log = logging.getLogger("sluice.settings")

CHECK_EVERY = 2.0  # seconds between two looks at the file
SETTLE = 0.5  # a new signature must hold this long before the file is read
INVALID, MISSING, RELOADED = "config_invalid", "config_missing", "config_reloaded"


class ConfigWatcher:
    """Watches one gateway's config.yaml (see the module docstring). The stat source is the
    settings' (``settings.file.stat``: tests give a fake one)."""

    def __init__(self, settings: Settings, notifications: Notifications, *,
                 every: float = CHECK_EVERY, settle: float = SETTLE) -> None:
        self.settings = settings
        self.notifications = notifications
        self.every = every
        self.settle = settle
        self.reloads = 0  # applied hand edits (for tests and the log)
        self._pending: FileSignature | None = None  # seen once, waiting to settle
        self._reported: FileSignature | None = None  # an invalid file already reported
        self._missing = False
        self._wake = trio.Event()
        settings.on_reload = self.report

    def __repr__(self) -> str:
        return f"ConfigWatcher({str(self.settings.config_path)!r}, reloads={self.reloads})"

    def hangup(self) -> None:
        """SIGHUP: look now, and read a changed file without waiting for it to settle."""
        self._wake.set()

    async def run(self, *, signals: bool = False,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if signals:
                await nursery.start(self._hangups)
            task_status.started()
            now = False
            while True:
                delay = await self.check(now=now)
                with trio.move_on_after(delay):
                    await self._wake.wait()
                now = self._wake.is_set()
                if now:
                    self._wake = trio.Event()

    async def _hangups(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                       ) -> None:
        with trio.open_signal_receiver(signal.SIGHUP) as received:
            task_status.started()
            async for _ in received:
                log.info("SIGHUP: reading config.yaml")
                self.hangup()

    async def check(self, *, now: bool = False) -> float:
        """One look at the file; returns the seconds until the next one."""
        settings = self.settings
        # One stat of a file in the data dir, on the loop: cheaper than a thread hop, and
        # what keeps the watcher's moments exact under a test's MockClock.
        seen = settings.file.stat(settings.config_path)
        if seen is not None and seen == settings.file.signature:
            self._pending = None
            self._all_clear()
            return self.every
        if seen is None:
            self._pending = None
            if not self._missing:
                await settings.reload_file()  # reports it
            return self.every
        if seen == self._reported and not now:  # the invalid file, told already
            return self.every
        if seen != self._pending and not now:
            self._pending = seen
            return self.settle
        self._pending = None
        found = await settings.reload_file()
        return self.settle if found.outcome == "unsettled" else self.every

    def report(self, found: Reload) -> None:
        """Tell the user what a look at the file found (see the module docstring)."""
        notes = self.notifications
        if found.outcome == "missing":
            self._missing = True
            notes.raise_(MISSING, f"config.yaml cannot be read ({found.error}): the gateway "
                                  "keeps running on its current settings; a settings change "
                                  "writes the file again")
            return
        self._missing = False
        notes.clear(MISSING)
        if found.outcome == "invalid":
            self._reported = found.signature
            notes.raise_(INVALID, f"config.yaml was not applied: {found.error}; the gateway "
                                  "keeps running on its previous settings until the file is "
                                  "fixed")
            return
        self._reported = None
        notes.clear(INVALID)
        if found.outcome != "applied":
            return
        self.reloads += 1
        message = f"config.yaml reloaded: {', '.join(found.sections)}"
        if found.restart:
            message += f" ({', '.join(found.restart)} apply at the next start)"
            notify_restart(notes, found.restart)
        notes.clear(RELOADED)  # each reload is news (and a log line), even in the same words
        notes.raise_(RELOADED, message, level="info")

    def _all_clear(self) -> None:
        if self._missing or self._reported is not None:
            self._missing = False
            self._reported = None
            self.notifications.clear(MISSING)
            self.notifications.clear(INVALID)


class Follower:
    """A settings subscriber that sees each change as (old, new)."""

    __slots__ = ("_apply", "_last")

    def __init__(self, apply: Callable[[Config, Config], None], current: Config) -> None:
        self._apply = apply
        self._last = current

    def __call__(self, new: Config) -> None:
        old, self._last = self._last, new
        self._apply(old, new)
