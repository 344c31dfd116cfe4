"""Observability (SPEC §9): the one feed (:mod:`.hub`) and what reads it — the request log,
the metrics and the live events."""
