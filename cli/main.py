"""The ``diarist`` command.

Subcommands (each in :mod:`cli.commands`, exposing ``add_parser(subparsers)`` whose parser sets
``func``): ``serve``, ``demo``, ``transcribe``, ``keys``, ``migrate``, ``worker``, ``engine``, and ``eval``
when its module is installed. Exit status: 0 success, 2 bad input or usage, 1 a dependency that does not
answer (the database, object store, broker or engine: ``diarist: error: <dependency>_unavailable: ...``) or
anything else.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

COMMANDS = ("serve", "demo", "transcribe", "keys", "migrate", "worker", "engine", "eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diarist", description="Speaker-attributed transcripts of recordings.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        # A subcommand whose module is absent (e.g. eval, added separately) is simply not offered.
        if importlib.util.find_spec(f"cli.commands.{name}") is None:
            continue
        importlib.import_module(f"cli.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from cli.listen import CannotListen
    from cli.options import BadOption
    from diarist.env_settings import InvalidSettings
    from engine.checkpoints import CheckpointError  # torch-free
    from engine.config import DeviceUnavailable

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DeviceUnavailable, CheckpointError, InvalidSettings, CannotListen, BadOption) as e:  # coded: one line
        print(f"diarist: error: {e.code}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        from diarist.outages import classify, reason

        dep = classify(e)  # diarist.outages: the one rule for "a dependency is down"
        if dep is None:
            raise  # a bug: the traceback is what to report
        print(f"diarist: error: {dep.code}: {reason(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
