"""LAN discovery over mDNS/DNS-SD (SPEC §14), loaded only when it is turned on: a gateway
with ``discovery.announce`` and ``discovery.browse`` off never imports this package (the
switch, :mod:`proxy.lan.discovery_switch`, imports it when one of them takes effect).

- :mod:`proxy.lan.discovery.link` — the mDNS socket (and the :class:`Link` seam tests fake);
- :mod:`proxy.lan.discovery.announcer` — ``_sluice._tcp`` announced, queries answered,
  goodbyes sent when it stops;
- :mod:`proxy.lan.discovery.browser` — queries on a doubling schedule, the sightings of every
  packet into the registry (:mod:`protocol.lan.discovered`), ``discovered`` events;
- :mod:`proxy.lan.discovery.service` — one socket for both, the interfaces followed.

The packets themselves are :mod:`protocol.lan.dnssd`'s; nothing here builds or parses DNS.
"""
