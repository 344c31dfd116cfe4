"""The ``sluice`` command line, except ``sluice serve`` (see :mod:`proxy.main`).

It talks to a running gateway through its admin API and never imports the server:
:mod:`~proxy.cli.args` parses, :mod:`~proxy.cli.admin` finds the gateway (state.json) and
calls it with the admin token, :mod:`~proxy.cli.render` turns answers into text (pure) and
:mod:`~proxy.cli.commands` runs ``status``, ``keys``, ``nodes`` and ``check-config``,
:mod:`~proxy.cli.pair` ``pair`` (SPEC §14).
The live feed (``events``, ``status --watch``): :mod:`~proxy.cli.feed` is its WebSocket
client, :mod:`~proxy.cli.lines` (one line per event) and :mod:`~proxy.cli.view` (the watched
status) are pure, :mod:`~proxy.cli.live` runs the two commands; only they load trio.
"""
