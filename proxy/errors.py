"""Exceptions of the I/O side that are not OpenAI errors."""


class ClientGone(Exception):
    """The client closed its connection or a send to it failed: nothing more can be sent."""


class CloseQuietly(Exception):
    """End the client connection without an answer (EOF, idle timeout, drain)."""
