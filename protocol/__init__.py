"""Sans-I/O half of sluice: bytes, events and values in and out. Nothing here does I/O."""
