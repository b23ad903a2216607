"""The device-side ``edgelearn`` commands, one module per command (``edge/commands/NAME.py`` is
``edgelearn NAME``), named in ``edge.cli.COMMANDS``.

They run on a Pi with only the plain install (numpy, one interpreter, ``cryptography``), so like
all of ``edge/`` they import nothing from ``host/``. Each module holds only
``add_arguments(parser)`` and ``run(args) -> int`` (and small helpers that print): the work is
``edge.device.Device`` and the rest of ``edge/``. The host-side commands live in ``host/commands/``.
"""
