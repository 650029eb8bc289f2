"""Refuse outbound URLs that point into our own network (webhooks, ``audio_url`` fetches).

A client-supplied URL is a classic server-side request forgery vector: ``http://169.254.169.254/`` or
``http://localhost:6379/`` would make the service talk to its own infrastructure. A URL is allowed when
every address its host resolves to is public (not loopback, private, link-local, reserved, multicast or
unspecified), or when the host, or one of its addresses, matches the allow-list (hostnames, IPs or CIDRs).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class UnsafeURL(ValueError):
    """The URL is malformed or resolves to a non-public address that is not allow-listed.

    ``code`` is ``invalid_url`` or ``url_not_allowed``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast
                or ip.is_unspecified)


def _allowed(host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow: list[str]) -> bool:
    for entry in allow:
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == host:
            return True
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def check_url(url: str, allow: list[str] | None = None, resolve: bool = True) -> str:
    """Validate an outbound http(s) URL; returns it unchanged.

    Args:
        allow: allow-list entries (hostnames, IPs, CIDRs) that may be non-public.
        resolve: resolve the hostname (DNS) and check every address; without it only literal IPs are checked.
    Raises:
        UnsafeURL: ``invalid_url`` (not http/https, no host) or ``url_not_allowed``.
    """
    allow = allow or []
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UnsafeURL("invalid_url", f"invalid URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeURL("invalid_url", "the URL must be http:// or https:// with a host")
    host = parts.hostname.lower()
    try:
        addrs = [ipaddress.ip_address(host)]
    except ValueError:
        if not resolve:
            return url
        try:
            infos = socket.getaddrinfo(host, port or (443 if parts.scheme == "https" else 80),
                                       type=socket.SOCK_STREAM)
        except OSError as e:
            raise UnsafeURL("invalid_url", f"cannot resolve host {host!r}: {e}") from None
        addrs = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addrs:
        if not _public(ip) and not _allowed(host, ip, allow):
            raise UnsafeURL("url_not_allowed",
                            f"{host} resolves to a non-public address ({ip}); add it to DIARIST_WEBHOOK_ALLOW_HOSTS "
                            "to permit it")
    return url
