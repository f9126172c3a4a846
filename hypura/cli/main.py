"""`hypura`: Hypura's own subcommands, each a thin module over the library, imported when it runs: `hypura synth`
and `hypura inspect` work before llama.cpp is built (a fresh GPU machine makes its models while it builds)."""

import importlib

import click

from hypura.cli.errors import run_cli

# name -> (module, attribute), in the order `hypura --help` lists them
_COMMANDS = {
    "synth": ("hypura.synth.command", "synth"),
    "profile": ("hypura.cli.profile_cmd", "profile"),
    "inspect": ("hypura.cli.inspect_cmd", "inspect"),
    "list": ("hypura.cli.list_cmd", "list_models"),
    "bench": ("hypura.cli.bench_cmd", "bench"),
    "routing": ("hypura.cli.routing_cmd", "routing"),
    "serve": ("hypura.cli.serve_cmd", "serve"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in _COMMANDS:
            return None
        module, attr = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hypura")
def cli() -> None:
    """Run GGUF models larger than GPU memory and RAM."""


def main() -> None:
    run_cli(cli)


if __name__ == "__main__":
    main()
