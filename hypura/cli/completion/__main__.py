"""`python -m hypura.cli.completion`: hypura-cli."""

from hypura.cli.completion import main

main()
