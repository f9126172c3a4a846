"""One place that turns Hypura's errors into llama-cli-style failures: one line, non-zero exit."""

import sys

import click

from hypura.errors import HypuraError


def run_cli(command: click.Command) -> None:
    try:
        command.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (HypuraError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
