"""Subcommands of the `diarist` CLI; each module exposes `add_parser(subparsers)` and `run(args)`."""


def plain(doc: str | None) -> str:
    """A module docstring as ``--help`` text: reStructuredText's double backticks dropped."""
    return (doc or "").replace("``", "")
