"""Computers on the LAN: discovery, pairing, this machine's addresses (SPEC §14)."""
