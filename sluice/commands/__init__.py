"""One module per `sluice` subcommand.

Each module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`. `sluice.main`
discovers them, so adding a command never touches a shared file.
"""
