"""config.yaml as a file (SPEC §2, §13): its text and signature as the gateway last read or
wrote it, reading a hand edit safely, writing atomically, and the history of what each
write replaced. Blocking work, called in :class:`~proxy.settings.store.Settings`' worker thread
under its one writer (the only caller).

A hand edit is read only between two identical signatures (device, inode, size, mtime), so
a file being written is never taken; an empty file is not applied live (at start it means
the defaults; while running it is a file being written, or a mistake).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import attrs

from protocol.config import Config, parse_config_text
from protocol.config.changes import changed_sections, restart_changes
from protocol.errors import ConfigError
from proxy.files import FileSignature, atomic_write, file_signature
from proxy.settings.config_history import HISTORY_DIR, ConfigHistory
from proxy.timestamps import wall

__all__ = ["ConfigFile", "Reload"]

log = logging.getLogger("sluice.settings")


@attrs.frozen
class Reload:
    """What a look at config.yaml found.

    ``outcome``: ``applied`` (``sections`` changed; ``restart`` lists the fields that wait
    for the next start), ``same`` (no setting changed: the gateway's own text, an unchanged
    file, or only comments), ``unsettled`` (it changed while being read: look again),
    ``invalid`` (``error`` says why; the running settings stay), ``missing`` (no file, or
    not a regular file: ``error`` says which). ``read`` is the step between: text read,
    not yet parsed."""

    outcome: str
    sections: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    error: ConfigError | None = None
    signature: FileSignature | None = None
    text: str | None = attrs.field(default=None, repr=False)


class ConfigFile:
    """One config.yaml and its history."""

    def __init__(self, path: Path, text: str, history: ConfigHistory) -> None:
        self.path = path
        self.text = text  # as last read or written here
        self.stat: Callable[[Path], FileSignature | None] = file_signature  # tests: a fake
        self.signature = file_signature(path)
        self.history = history
        # a hand edit that is not valid, which the next write replaces: kept in the history
        self.unseen: str | None = None

    def __repr__(self) -> str:
        return f"ConfigFile({str(self.path)!r}, {self.signature})"

    def read(self) -> Reload:
        """The file's text when it changed since last read or written here."""
        path = self.path
        before = self.stat(path)
        if before is None:
            what = "not a file" if path.is_dir() else "the file is gone"
            return Reload("missing", error=ConfigError("", f"{path}: {what}"))
        if before == self.signature:
            return Reload("same", signature=before)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:  # replaced between the stat and the open
            return Reload("unsettled")
        except UnicodeDecodeError:
            return Reload("invalid", signature=before, text="",
                          error=ConfigError("", f"{path}: not valid UTF-8 text"))
        except OSError as exc:
            return Reload("missing", error=ConfigError("", f"{path}: cannot read "
                                                           f"({exc.strerror})"))
        if self.stat(path) != before:
            return Reload("unsettled")
        return Reload("read", signature=before, text=text)

    def parse(self, found: Reload, current: Config) -> tuple[Reload, Config | None]:
        """A text :meth:`read` found: applied (with the config to publish), ``same``
        settings (with the config as it is), or ``invalid`` (no config)."""
        text = found.text or ""
        if text == self.text:
            return attrs.evolve(found, outcome="same"), current
        try:
            if not text.strip():
                raise ConfigError("", "the file is empty; it is not applied while the gateway "
                                      "runs (an empty file means the defaults only at start)")
            cfg = parse_config_text(text)
        except ConfigError as exc:
            return attrs.evolve(found, outcome="invalid", error=exc), None
        sections = changed_sections(current, cfg)
        if not sections:
            return attrs.evolve(found, outcome="same"), current
        return attrs.evolve(found, outcome="applied", sections=sections,
                            restart=tuple(restart_changes(current, cfg))), cfg

    def adopt(self, found: Reload, source: str) -> None:
        """The text ``found`` is now the file as the gateway knows it (it was applied, or it
        changed nothing); the one it replaced goes to the history when they differ."""
        text = found.text or ""
        previous, self.text = self.text, text
        self.signature = found.signature
        if previous != text:
            self.keep(previous, source, found.sections)

    def write(self, text: str, source: str, sections: tuple[str, ...]) -> None:
        """config.yaml := ``text``, atomically (through a symlink: the link stays); the file
        it replaced goes to the history when the text differs."""
        target = Path(os.path.realpath(self.path))  # e.g. kept in a dotfiles repo
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = 0o600
        atomic_write(target, text.encode(), mode)
        previous = self.text if self.unseen is None else self.unseen
        if self.unseen is not None:
            log.warning("config.yaml had a hand edit that is not valid; this settings change "
                        "replaced it and the edit is kept in %s/", HISTORY_DIR)
        self.text, self.unseen = text, None
        self.signature = self.stat(self.path)
        if previous != text:
            self.keep(previous, source, sections)

    def keep(self, previous: str, source: str, sections: tuple[str, ...]) -> None:
        try:
            self.history.keep(previous, source, sections, wall())
        except OSError as exc:  # the change itself stands
            log.warning("cannot keep the previous config.yaml in %s/: %s", HISTORY_DIR,
                        exc.strerror)
