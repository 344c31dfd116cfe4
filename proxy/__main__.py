"""``python -m proxy`` is the ``sluice`` command."""

from proxy.main import main

raise SystemExit(main())
