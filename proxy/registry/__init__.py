"""What exists and its health: local backends, network nodes, their checks and probes."""
