"""Managed local model servers: llama.cpp (xllamacpp) children that sluice starts, watches,
restarts and stops itself."""
