"""The web console (SPEC §10): static files only (``static/``: HTML, CSS and JavaScript
modules, no build step), shipped as package data and served at ``/ui/`` by
:mod:`proxy.api.console`. Notes for developers: ``docs/console.md``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC_DIR"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
