"""The `k25exp` subcommands, one module each, each owning its parser (k25exp.cli dispatches)."""
