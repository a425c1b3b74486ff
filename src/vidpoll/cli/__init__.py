"""The `vidpoll` command: wiring only; every behaviour lives in the modules it calls.

One module per command group, each registered on `main` below: `worker`, `submit` (and the
`intents` group), `jobs`, `deliveries`, `serve`, `ops` (migrate, doctor, demo, fake-sume);
what they share is in `_common`. A command module imports click and the standard library at
module level and everything else (aiohttp, psycopg, rich, the fake provider) in the command's
body: `vidpoll --help` imports every command module, and a command pays only for what it uses.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

import vidpoll
from vidpoll import logs
from vidpoll.cli._common import _stderr
from vidpoll.cli.deliveries import deliveries
from vidpoll.cli.jobs import jobs
from vidpoll.cli.ops import demo_cmd, doctor_cmd, fake_sume_cmd, migrate_cmd
from vidpoll.cli.serve import serve_cmd
from vidpoll.cli.spend import spend_cmd
from vidpoll.cli.submit import intents, submit_cmd
from vidpoll.cli.worker import worker_cmd

__all__ = ["main"]


class _Main(click.Group):
    """The `vidpoll` group: a usage error (a bad flag or value, an unreadable --json file) is
    one line and exit 2, like every setting error, instead of click's usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line (click's entry point); exit with the command's code."""
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        kwargs["standalone_mode"] = False
        # an error found before `main` runs (an unknown option or command) is said in the
        # format asked for, as every later line is
        argv = kwargs.get("args") or (args[0] if args else None)
        logs.console(_early_format(sys.argv[1:] if argv is None else list(argv)))
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `vidpoll` alone: the help
                exc.show()
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _stderr(f"error: {exc.format_message()}{hint}")
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            _stderr("error: aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _early_format(argv: list[str]) -> str:
    """The log format the command line asks for (--log-format before the command, else
    VIDPOLL_LOG_FORMAT), read before click parses it."""
    fmt = os.environ.get("VIDPOLL_LOG_FORMAT", "text")
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        name, eq, value = argv[at].partition("=")
        if name in ("--log-format", "--log-level") and not eq:
            value, at = (argv[at + 1] if at + 1 < len(argv) else ""), at + 1
        if name == "--log-format":
            fmt = value
        at += 1
    return "json" if fmt == "json" else "text"


def _version() -> str:
    # the installed distribution's version, or 0+unknown run from a checkout never installed
    # (importlib.metadata, which finds it, is read only now: it is slow to import)
    return vidpoll.__version__


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"vidpoll {_version()}")
        ctx.exit()


@click.group(cls=_Main)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Print vidpoll's version and exit.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, envvar="VIDPOLL_LOG_FORMAT",
              type=click.Choice(["text", "json"]),
              help="One line per event; json: one object per line. Secrets and signed URL "
                   "query strings are redacted either way.")
@click.option("--no-embedded", is_flag=True,
              help="With DATABASE_URL unset, exit 2 instead of using the embedded PostgreSQL "
                   "(as VIDPOLL_EMBEDDED=off does).")
def main(log_level: str, log_format: str, no_embedded: bool) -> None:
    """Track paid AI video jobs in one Postgres table and poll them with any number of workers.

    Uses DATABASE_URL, or an embedded PostgreSQL under VIDPOLL_HOME when it is unset (each
    command that does says so on stderr; VIDPOLL_EMBEDDED=off or --no-embedded refuses it).
    """
    logs.setup(log_level, log_format)
    # (the embedded server's notice is pointed at stderr by `_settings`: importing
    # vidpoll.embedded here would load psycopg for every command, --help included)


main.add_command(migrate_cmd)
main.add_command(worker_cmd)
main.add_command(fake_sume_cmd)
main.add_command(jobs)
main.add_command(doctor_cmd)
main.add_command(deliveries)
main.add_command(submit_cmd)
main.add_command(intents)
main.add_command(serve_cmd)
main.add_command(spend_cmd)
main.add_command(demo_cmd)
