"""A real aggregator (``host.aggregator`` under uvicorn) on a loopback port, for gateway and Wi-Fi tests.

The MCU fleet federates what a board trains, the bias-only prototype head
(``proto/bias``, 4 values), from the MCU bundle; asynchronous rounds (FedBuff)
accept updates trained from the board's bundle version.

    state = mcu_aggregator_state(tmp_path, {"esp32-07": key})
    agg = LiveAggregator(state)          # agg.url = "http://127.0.0.1:PORT"
    ...
    agg.updates()                        # [(device_id, seq, round_id), ...]
    agg.close()
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np

from host.board.fs import DEFAULT_BUNDLE


def mcu_aggregator_state(tmp: Path, devices: dict, bundle: Path = DEFAULT_BUNDLE) -> Path:
    """An aggregator state directory for the MCU fleet with ``devices`` ({id: key}) provisioned."""
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.setup import init_state, provision
    state = Path(tmp) / "agg"
    init_state(state, AggregatorConfig(mode="async", buffer_size=10, tiers=["mcu"], min_battery=0.2),
               bundle=bundle, params={"proto/bias": np.zeros(4, np.float32)})
    for dev, key in devices.items():
        provision(state, dev, key=key, tier="mcu")
    return state


class LiveAggregator:
    """``host.aggregator`` served by uvicorn on 127.0.0.1 in a thread."""

    def __init__(self, state: Path):
        import uvicorn

        from host.aggregator.app import build_app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.app = build_app(state)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        if not self.server.started:
            raise RuntimeError("uvicorn did not start on loopback")

    def updates(self) -> list:
        return self.app.state.aggregator.store.all("SELECT device_id, seq, round_id FROM updates ORDER BY seq")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
