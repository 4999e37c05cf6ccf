"""Help texts keep their words: typer renders every help text as rich markup, where ``[analyses.<name>]`` or
``[[models]]`` is a tag and vanishes. :func:`keep_brackets` escapes each help text once, where the command tree is
declared (every command's and group's help and every option's and argument's), so ``--help`` shows what was written."""

from __future__ import annotations

import inspect

import typer
from rich.markup import escape

_ESCAPED: dict[int, object] = {}  # id -> the info object escaped (kept, so an id is never reused)


def _escape_info(info) -> None:
    if id(info) in _ESCAPED:  # shared options appear in many commands: escape each once
        return
    _ESCAPED[id(info)] = info
    if isinstance(getattr(info, "help", None), str):
        info.help = escape(info.help)


def _escape_command(command) -> None:
    callback = command.callback
    if command.help is None and callback is not None and inspect.getdoc(callback):
        command.help = inspect.getdoc(callback)
    _escape_info(command)
    if callback is None:
        return
    for parameter in inspect.signature(callback).parameters.values():
        if isinstance(parameter.default, typer.models.ParameterInfo):
            _escape_info(parameter.default)


def keep_brackets(app: typer.Typer) -> None:
    """Escape the help texts of ``app``'s commands, groups and their parameters (once each; idempotent)."""
    _escape_info(app.info)
    if app.registered_callback is not None:
        _escape_command(app.registered_callback)
    for command in app.registered_commands:
        _escape_command(command)
    for group in app.registered_groups:
        _escape_info(group)
        if group.typer_instance is not None:
            keep_brackets(group.typer_instance)
