"""Command-line front ends: `hypura` (Hypura's own subcommands) and `hypura-cli` (llama-cli drop-in)."""
