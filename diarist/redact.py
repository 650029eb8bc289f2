"""What of a URL may be stored, shown or logged: scheme, host, port and path; never the userinfo
(``user:password@``), the query string or the fragment, which is where pre-signed S3 links, bearer tokens
and API keys live. One rule for the job row, API responses, the dashboard and every log line.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL = re.compile(r"""\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+""")


def display_url(url: str) -> str:
    """``url`` without credentials, query or fragment (``https://u:p@h/a.wav?sig=x`` → ``https://h/a.wav``).

    A string that does not parse as a URL gives ``"<url>"`` rather than itself.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<url>"
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_text(text: str) -> str:
    """Every URL in ``text`` replaced by its :func:`display_url` (for log lines and error messages)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: display_url(m.group(0)), text)
