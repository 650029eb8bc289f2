"""The listen-address check every serving command runs before it starts anything (``serve``, ``engine``,
``demo --port``), and the socket it then serves on (:func:`bind_listen`: port 0 is the free port the OS picks,
and the printed URL names that port).

A port already taken would otherwise surface only when uvicorn binds it, after the database, the workers and
the model (minutes of weight loading and graph capture) have started, as a log line and exit status 3. The
check is a probe released at once: the port opens only when uvicorn listens, so "port open" still means
"ready" (a process that takes the port meanwhile makes uvicorn fail as before).
"""

from __future__ import annotations

import errno
import socket

# MAX_PORT is checked here too: getaddrinfo takes a larger port (glibc wraps it modulo 65536) while uvicorn's
# bind raises OverflowError, a traceback after the model loads
from diarist.urls import MAX_PORT


class CannotListen(Exception):
    """The address cannot be listened on. ``code``: ``address_in_use`` (another process holds the port) or
    ``cannot_listen`` (anything else: an unresolvable or non-local host, a privileged port); the message is
    ``cannot listen on HOST:PORT: <reason>``. The CLI prints it as its one error line and exits 2."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_listen(host: str, port: int) -> None:
    """Bind and listen on ``(host, port)`` as uvicorn will, then release it at once.

    ``port`` 0 (any free port) always passes. Raises:
        CannotListen: ``port`` is outside ``0..MAX_PORT``, or the bind or listen fails (see the class for
            the codes).
    """
    if not 0 <= port <= MAX_PORT:
        raise CannotListen("cannot_listen", f"cannot listen on {host}:{port}: a port is 0-{MAX_PORT}")
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
            probe.bind(addr)
            probe.listen(1)  # bind alone does not see a rival that also reuses the address
    except OSError as e:
        code = "address_in_use" if e.errno == errno.EADDRINUSE else "cannot_listen"
        raise CannotListen(code, f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def bind_listen(host: str, port: int) -> socket.socket:
    """:func:`check_listen` ``(host, port)``, then a socket bound to it and not yet listening, for
    ``uvicorn.Server.run(sockets=[...])``, which listens once the app is ready: until then a client is refused
    rather than left waiting, as with a port uvicorn binds itself. ``port`` 0 binds the free port the OS
    picks: read it with ``sock.getsockname()[1]`` and print that one. The caller owns (closes) the socket.

    Raises:
        CannotListen: as :func:`check_listen`.
    """
    check_listen(host, port)
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        sock.bind(addr)
    except OSError as e:  # taken between the check and here
        sock.close()
        code = "address_in_use" if e.errno == errno.EADDRINUSE else "cannot_listen"
        raise CannotListen(code, f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(host: str, sock: socket.socket) -> str:
    """``http://HOST:PORT`` of ``sock`` bound on ``host`` (an IPv6 address in brackets, RFC 3986), with the
    port it is bound to, not the one asked for (0)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}"


def loopback_of(host: str) -> str:
    """The address a client on this machine reaches a server listening on ``host`` at, for a URL: the
    loopback of the wildcard addresses (``0.0.0.0``, ``::``, empty), ``host`` itself otherwise (an IPv6
    address in brackets, RFC 3986)."""
    reach = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{reach}]" if ":" in reach else reach
