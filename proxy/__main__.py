"""``python -m proxy`` is the ``sluice`` command."""

from proxy.cli import main

raise SystemExit(main())
