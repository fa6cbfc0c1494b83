"""Old spellings of command-line options, kept working for now: :func:`deprecated_alias` adds ``old`` beside an
option ``new`` of a parser (same destination, hidden from ``--help``); using it prints one line to stderr,
``--old is deprecated: use --new``, and then does what ``new`` would have done (with ``convert``: with the value
rewritten into ``new``'s spelling, e.g. ``--tree-nodes 16`` into ``--proposer tree:16``)."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from typing import Any

# What an alias copies from its option, where the option's action class takes it.
COPIED = ("nargs", "const", "type", "choices", "metavar")


def notice(old: str, new: str) -> str:
    """The one deprecation line."""
    return f"{old} is deprecated: use {new}"


def deprecated_alias(parser: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: str,
                     convert: Callable[[str], str] | None = None, note: str | None = None) -> argparse.Action:
    """Add ``old`` to ``parser`` as a hidden, deprecated spelling of its option ``new`` (which must be added first).

    Without ``convert`` the alias takes ``new``'s arguments as they are. With ``convert`` it takes one string and
    ``new`` receives ``convert(value)`` (through ``new``'s own type and action). ``note`` replaces ``new`` in the
    notice (``--tree-nodes is deprecated: use --proposer tree:N``)."""
    container = parser
    target = container._option_string_actions[new]  # KeyError: add the new option first
    message = notice(old, note or new)

    if convert is None:
        base = type(target)

        class Alias(base):  # type: ignore[misc, valid-type]
            def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                         option_string: str | None = None) -> None:
                print(message, file=sys.stderr)
                super().__call__(parser, namespace, values, option_string)

        accepted = inspect.signature(base.__init__).parameters
        kwargs = {key: getattr(target, key) for key in COPIED if key in accepted and getattr(target, key) is not None}
    else:

        class Alias(argparse.Action):  # type: ignore[no-redef]
            def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                         option_string: str | None = None) -> None:
                print(message, file=sys.stderr)
                current = getattr(namespace, target.dest, None)
                if current is not None and current != target.default:
                    parser.error(f"{option_string} and {new} (or another old spelling of it) set the same: give one")
                items = values if isinstance(values, list) else [values]
                converted = [parser._get_value(target, convert(item)) for item in items]
                target(parser, namespace, converted if target.nargs not in (None, "?") else converted[0], new)

        kwargs = {"nargs": target.nargs} if target.nargs not in (None, "?", 0) else {}
    return container.add_argument(old, action=Alias, dest=target.dest, default=argparse.SUPPRESS,
                                  help=argparse.SUPPRESS, **kwargs)


class DeprecatedStore(argparse._StoreAction):
    """Stores as ``store`` does, after the deprecation line (``self.notice``)."""

    notice = ""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(self.notice, file=sys.stderr)
        super().__call__(parser, namespace, values, option_string)


def deprecated_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, use: str,
                      **kwargs: Any) -> argparse.Action:
    """Add ``old``, an option that lives on inside another one's value (``--draft-vocab-from TEXT``: ``--draft-vocab
    N:TEXT``), hidden, storing as ``add_argument(old, **kwargs)`` would after the line ``<old> is deprecated: use
    <use>``; the command reads both."""
    action = parser.add_argument(old, action=DeprecatedStore, help=argparse.SUPPRESS, **kwargs)
    action.notice = notice(old, use)
    return action
