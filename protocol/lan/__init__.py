"""The LAN's packets and decisions, pure: mDNS/DNS-SD messages, what was found, pairing
(SPEC §14)."""
