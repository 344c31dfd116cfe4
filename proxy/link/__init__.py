"""Links: the bytes of a connection, whoever is at the other end (client, model server,
another gateway), plain or TLS. A :class:`~proxy.link.wire.Wire` (plain:
:class:`~proxy.link.sockio.PlainWire`; TLS 1.3: :class:`~proxy.link.tlsio.TlsChannel`) is
what the client connection, its writer and the upstream connection read and write; the
TLS contexts of both ends and the pinned handshake are :mod:`proxy.link.tls`; this
gateway's certificate :mod:`proxy.link.identity`; the listeners, each with its wire, its
peers and its column of the access table, :mod:`proxy.link.listener` (the node listener's
TLS side: :mod:`proxy.link.node_listener`)."""
