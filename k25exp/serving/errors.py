"""What can go wrong with a server, as exceptions the runners catch by kind."""

from __future__ import annotations


class ServerError(RuntimeError):
    """The server could not be started, reached, or kept alive."""


class ServerStartError(ServerError):
    pass


class PortInUse(ServerStartError):
    """The launched server could not bind its port (someone else holds it)."""

    def __init__(self, message: str, port: int):
        super().__init__(message)
        self.port = port


class ServerDied(ServerError):
    pass


class BadAnswer(ServerError):
    """The server (or something in front of it) answered, but not what was asked for."""
