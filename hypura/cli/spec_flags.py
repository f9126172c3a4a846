"""llama-server's speculative decoding flags on `hypura serve` and `hypura bench`: hypura-cli's definitions
(cli/completion/speculative.py), as click options and as SpecSettings."""

from __future__ import annotations

import click

from hypura.cli.completion.speculative import SPEC_OPTIONS
from hypura.errors import HypuraError


def spec_options(command):
    for decls, kw in reversed(SPEC_OPTIONS):
        command = click.option(*decls, **kw)(command)
    return command


def spec_from_flags(spec: dict, default=None):
    """The --spec-* flags as SpecSettings; `default` without -md or --spec-type (None: no speculation)."""
    from hypura.cli.completion.arg_values import ArgvError
    from hypura.cli.completion.speculative import spec_settings

    try:
        return spec_settings(dict(spec), default)
    except ArgvError as e:
        raise HypuraError(str(e)) from None
