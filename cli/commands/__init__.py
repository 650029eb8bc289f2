"""Subcommands of the `diarist` CLI; each module exposes `add_parser(subparsers)` and `run(args)`."""

import re


def plain(doc: str | None) -> str:
    """A module docstring as ``--help`` text: reStructuredText's double backticks and Sphinx roles
    (``:mod:`x```, ``:func:`x```) reduced to their text."""
    return re.sub(r":[a-z]+:`([^`]+)`", r"\1", (doc or "").replace("``", ""))
