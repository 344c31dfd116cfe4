"""Connections to model servers and nodes, and their pool."""
