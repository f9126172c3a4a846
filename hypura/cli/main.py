"""`hypura`: Hypura's own subcommands, each a thin module over the library."""

import click

from hypura.cli.errors import run_cli


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hypura")
def cli() -> None:
    """Run GGUF models larger than GPU memory and RAM."""


def _register() -> None:
    from hypura.cli.bench_cmd import bench
    from hypura.cli.inspect_cmd import inspect
    from hypura.cli.list_cmd import list_models
    from hypura.cli.profile_cmd import profile
    from hypura.cli.routing_cmd import routing
    from hypura.cli.serve_cmd import serve
    from hypura.synth.command import synth

    for command in (synth, profile, inspect, list_models, bench, routing, serve):
        cli.add_command(command)


_register()


def main() -> None:
    run_cli(cli)


if __name__ == "__main__":
    main()
