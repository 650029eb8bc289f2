"""Refuse outbound URLs that point into our own network (webhooks, ``audio_url`` fetches).

A client-supplied URL is a classic server-side request forgery vector: ``http://169.254.169.254/`` or
``http://localhost:6379/`` would make the service talk to its own infrastructure. A URL is allowed when
every address its host resolves to is globally reachable (``ipaddress``'s ``is_global``: the IANA
special-purpose registries, so loopback, RFC 1918, carrier-grade NAT 100.64.0.0/10, link-local,
benchmarking, documentation, reserved and unique-local addresses are all refused) and not multicast, or
when the host, or one of its addresses, matches the caller's allow-list (hostnames, IPs or CIDRs). An IPv6
address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, 6to4
``2002::/16``, NAT64 ``64:ff9b::/96``, Teredo) is judged by the IPv4 address it reaches as well.

Webhook targets and ``audio_url`` fetches have separate allow-lists (``DIARIST_WEBHOOK_ALLOW_HOSTS``,
``DIARIST_AUDIO_URL_ALLOW_HOSTS``): letting the service POST to an internal receiver is not letting
clients make it download from internal hosts.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from diarist.contract.errors import CodedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class UnsafeURL(CodedError, ValueError):
    """The URL is malformed or resolves to a non-public address that is not allow-listed (HTTP 422).

    ``code`` is ``invalid_url`` or ``url_not_allowed``.
    """

    status = 422


def embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address reaches through a transition mechanism (empty for IPv4 or plain
    IPv6): IPv4-mapped, IPv4-compatible, 6to4, NAT64 (well-known prefix) and Teredo (server and client)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    out = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def is_public(ip: IPAddress) -> bool:
    """True when ``ip`` and every IPv4 address it carries are global unicast addresses (``is_global`` and not
    multicast)."""
    return all(a.is_global and not a.is_multicast for a in (ip, *embedded_ipv4(ip)))


def _allowed(host: str, ip: IPAddress, allow: list[str]) -> bool:
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


def check_url(url: str, allow: list[str] | None = None, resolve: bool = True,
              setting: str = "DIARIST_WEBHOOK_ALLOW_HOSTS") -> str:
    """Validate an outbound http(s) URL; returns it unchanged.

    Args:
        allow: allow-list entries (hostnames, IPs, CIDRs) that may be non-public.
        resolve: resolve the hostname (DNS) and check every address (IPv4 and IPv6); without it only
            literal IPs are checked.
        setting: the environment variable holding ``allow``, named in the refusal.
    Raises:
        UnsafeURL: ``invalid_url`` (not http/https, no host, unresolvable) or ``url_not_allowed``. Messages
        name the host only, never the path or query of the URL.
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
        addrs: list[IPAddress] = [ipaddress.ip_address(host)]
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
        if not is_public(ip) and not _allowed(host, ip, allow):
            raise UnsafeURL("url_not_allowed",
                            f"{host} resolves to a non-public address ({ip}); add it to {setting} to permit it")
    return url
