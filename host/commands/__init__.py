"""The host-side ``edgelearn`` commands, one module per command (``host/commands/NAME.py`` is
``edgelearn NAME``), named in ``edge.cli.COMMANDS``.

Each module holds only ``add_arguments(parser)`` and ``run(args) -> int`` (and small helpers that
print): the work itself is library code elsewhere in ``host/`` (``host.train``, ``host.bundle``,
``host.serve``, ...), callable the same from Python. The device-side commands live in
``edge/commands/`` (they must run on a Pi with only the plain install).
"""
