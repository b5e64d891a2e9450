"""One workflow per subcommand, usable from Python without the CLI."""
