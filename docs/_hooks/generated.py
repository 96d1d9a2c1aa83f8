"""MkDocs hook: the reference pages' generated parts, made from the code at build time.

A page holds a marker line, ``<!-- generated: settings -->`` or ``<!-- generated: commands -->``,
and the build puts the settings table (from ``execbox_runner.daemon.config``) or each command's
``--help`` (from the command line's own parsers) in its place, so the reference never drifts
from what the daemon accepts.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from typing import Any

from execbox_runner_conformance.cli import build_parser as build_conformance_parser

from execbox_runner.cli import build_parser
from execbox_runner.daemon import config

SETTINGS_MARK = "<!-- generated: settings -->"
COMMANDS_MARK = "<!-- generated: commands -->"
HELP_COLUMNS = "100"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_reference())
    if COMMANDS_MARK in markdown:
        markdown = markdown.replace(COMMANDS_MARK, commands_reference())
    return markdown


def settings_reference() -> str:
    """One table per topic: each setting's flag and variable, default, meaning and rule."""
    kinds = {field.name: type(field.default) for field in fields(config.Settings)}
    parts = []
    for title, names in config.GROUPS:
        rows = ["| Flag and variable | Default | Meaning |", "| --- | --- | --- |"]
        for name in names:
            flag = "--" + name.replace("_", "-")
            variable = config.ENV_PREFIX + name.upper()
            rule = config.rule(name, kinds[name])
            meaning = config.HELP[name][:1].upper() + config.HELP[name][1:] + (f". *Values: {rule}.*" if rule else "")
            rows.append(f"| `{flag}`<br>`{variable}` | {config.default_text(name)} | {cell(meaning)} |")
        parts.append(f"### {title}\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


def commands_reference() -> str:
    """Each command's ``--help``, as a terminal of ``HELP_COLUMNS`` columns prints it."""
    os.environ["COLUMNS"] = HELP_COLUMNS
    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    sections = [help_section("execbox-runner", parser)]
    sections += [help_section(f"execbox-runner {name}", sub) for name, sub in commands.choices.items()]
    sections.append(help_section("execbox-conformance", build_conformance_parser()))
    return "\n\n".join(sections)


def help_section(title: str, parser: argparse.ArgumentParser) -> str:
    return f"### `{title}`\n\n```text\n{help_without_settings(parser).rstrip()}\n```"


def help_without_settings(parser: argparse.ArgumentParser) -> str:
    """``parser.format_help()`` without the settings' groups, which the configuration page has."""
    settings = {title for title, _ in config.GROUPS}
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    formatter.add_text(parser.description)
    for group in parser._action_groups:
        if group.title in settings:
            continue
        formatter.start_section(group.title)
        formatter.add_text(group.description)
        formatter.add_arguments(group._group_actions)
        formatter.end_section()
    if any(group.title in settings for group in parser._action_groups):
        formatter.add_text("settings: every setting of the configuration reference, as a flag")
    formatter.add_text(parser.epilog)
    return formatter.format_help()


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
