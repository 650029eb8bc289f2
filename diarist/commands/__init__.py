"""Subcommands of the `diarist` CLI; each module exposes `add_parser(subparsers)` and `run(args)`."""
