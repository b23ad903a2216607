"""The serving shim on a daemon thread with an ephemeral loopback port, for the demo, tests and
benchmarks (``edgelearn serve``, ``host/commands/serve.py``, runs it in the foreground):

    >>> with BackgroundServer(server, bundle="b") as url:
    ...     httpx.get(url + "/v2/health/ready")
"""

from __future__ import annotations

import socket
import threading
import time


class BackgroundServer:
    """uvicorn on a daemon thread, bound to 127.0.0.1 on a free port."""

    def __init__(self, server, bundle=None, host: str = "127.0.0.1"):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = server
        config = uvicorn.Config(server.app(bundle=bundle), log_level="warning", access_log=False,
                                lifespan="on")
        self.uv = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.uv.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the serving shim did not start (see the log above)")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.uv.should_exit = True
        self.thread.join(60)
        self.sock.close()
