"""Every option of a long-running command from a ``PYRULA_*`` environment variable.

A pod is configured by its environment (a ConfigMap, a Secret), not by a command line
that each deployment rewrites. The variable of ``--max-concurrent-turns`` is
``PYRULA_MAX_CONCURRENT_TURNS``: the option's ``dest`` in capitals after ``PYRULA_``
(``ENV_NAMES`` holds the exceptions). One mechanism for every option: a value is read by
the option's own ``type`` and checked against its own ``choices``, so the environment
accepts exactly what the command line does. A flag given on the command line wins over
the variable, the variable over the default. Switches (``store_true``) take
``1/true/yes/on`` or ``0/false/no/off``; repeatable options take a comma-separated list.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from pyrula_stream.errors import ConfigurationError

ENV_PREFIX = "PYRULA_"
ENV_NAMES = {"api_keys": "PYRULA_API_KEYS_FILE"}
"""Options whose variable is not ``PYRULA_<DEST>``: ``$PYRULA_API_KEYS`` holds the
gateway's keys themselves, so the file of ``--api-keys FILE`` is ``PYRULA_API_KEYS_FILE``."""

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})
SKIPPED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def env_name(action: argparse.Action) -> str:
    return ENV_NAMES.get(action.dest, ENV_PREFIX + action.dest.upper())


def env_options(parser: argparse.ArgumentParser) -> Iterable[argparse.Action]:
    """The options of ``parser`` a variable can set (not positionals, help, version)."""
    for action in parser._actions:
        if action.option_strings and not isinstance(action, SKIPPED):
            yield action


def from_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """Let ``environ`` set the defaults of ``parser``'s options, and say so in the help.

    Returns what is wrong with the values the options would refuse, each naming its
    variable: the caller decides when that matters (only when its command runs).
    """
    errors: list[str] = []
    for action in env_options(parser):
        name = env_name(action)
        if action.help != argparse.SUPPRESS:
            action.help = f"{action.help or ''} [env: {name}]".strip()
        if name not in environ:
            continue
        try:
            action.default = _value(parser, action, name, environ[name])
        except ConfigurationError as exc:
            errors.append(str(exc))
            continue
        action.required = False
    return errors


class _FromEnv(list[Any]):
    """Items of a repeatable option that came from the environment: the first flag on
    the command line replaces them (``argparse`` copies the list before appending)."""

    def __copy__(self) -> list[Any]:
        return []


def _value(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    if action.nargs == 0:  # a switch: store_true, store_false, store_const
        word = raw.strip().lower()
        if word not in TRUE | FALSE:
            raise ConfigurationError(f"${name}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
        return action.const if word in TRUE else action.default
    if isinstance(action, argparse._AppendAction):
        items = [part.strip() for part in raw.split(",") if part.strip()]
        return _FromEnv(_convert(parser, action, name, item) for item in items)
    return _convert(parser, action, name, raw)


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    try:
        value = parser._get_value(action, raw)
    except argparse.ArgumentError as exc:
        raise ConfigurationError(f"${name}: {exc.message}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigurationError(f"${name}={raw!r}: expected one of {choices}")
    return value
