"""Write docs/cli.md from the commands' own --help (``make docs``); the test
suite checks that the file is current, so the reference cannot drift."""
import os
import sys

import click

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(os.path.dirname(HERE), "docs", "cli.md")


def render():
    from streamtrace.cli import main

    lines = ["# Command-line reference", "",
             "Generated from `streamtrace --help` by `make docs` (scripts/cli_docs.py); "
             "`make test` fails when it is out of date.", ""]
    for path, command, ctx in _commands(main, "streamtrace", None):
        lines += [f"## `{' '.join(path)}`", "", "```", command.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(lines)


def _commands(command, name, parent):
    """(path, command, context) of a command and its subcommands, with the
    contexts the CLI itself makes (help option names, fixed width)."""
    ctx = command.make_context(name, [], parent=parent, resilient_parsing=True, terminal_width=100,
                               max_content_width=100)
    yield ctx.command_path.split(), command, ctx
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, sub), sub, ctx)


if __name__ == "__main__":
    text = render()
    if sys.argv[1:] == ["--check"]:
        current = open(TARGET).read() if os.path.exists(TARGET) else ""
        sys.exit(0 if current == text else "docs/cli.md is out of date: run `make docs`")
    with open(TARGET, "w") as f:
        f.write(text)
