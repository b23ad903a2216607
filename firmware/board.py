"""Everything board-specific in one place; the rest of the firmware runs on the unix port too.

``Esp32Board`` (firmware/esp32_board.py, imported only on a board) uses ``machine.I2S`` (an I2S MEMS microphone, 16 kHz, 16-bit
mono), the battery through a 1:2 divider on an ADC1 pin (``ADC.read_uv()``,
calibrated; ADC2 is unusable while Wi-Fi runs), the die temperature
(``esp32.mcu_temperature()`` on S2/S3/C3, ``esp32.raw_temperature()`` in °F
on the original ESP32), light/deep sleep and the littlefs filesystem. The
serial link is the USB-UART REPL's stdin/stdout with Ctrl-C disabled.
``FakeBoard`` answers the same calls from settable values and a directory,
so tests and the pty rig run the real main loop.

    from firmware.board import make_board
    board = make_board()                     # Esp32Board on a board, FakeBoard elsewhere
    board.battery_pct(), board.temp_c(), board.read_audio(buf)
"""

import os
import struct
import sys

from edge.portable.compat import const

_ENOSPC = const(28)


def atomic_write(path, data):
    """Write ``data`` (bytes, or a tuple of parts) to ``path``: after a power cut the old file or the new one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            if isinstance(data, tuple):  # parts written in turn: no joined copy on the heap
                for part in data:
                    f.write(part)
            else:
                f.write(data)
        os.rename(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if e.args and e.args[0] == _ENOSPC:
            raise OSError(_ENOSPC, "filesystem full writing %s" % path)
        raise


def read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _mkdir(path):
    try:
        os.mkdir(path)
    except OSError:
        pass


class BoardBase:
    """What every board shares: paths under ``root`` and the state directories."""

    root = ""

    def path(self, name):
        return self.root + name

    def ensure_dirs(self):
        _mkdir(self.path("state"))
        _mkdir(self.path("bundle"))


class FakeBoard(BoardBase):
    """The unix port's stand-in: readings are attributes, files a directory, the microphone a WAV file.

    ``wav`` is a 16 kHz mono 16-bit PCM WAV that ``read_audio`` plays once
    (``loop=True``: over and over), as ``machine.I2S.readinto`` would fill the
    buffer from the microphone; at its end ``read_audio`` returns 0.
    """

    name = "fake"

    def __init__(self, root="", battery=90, charging=True, temp=35.0, stdin=None, stdout=None, wav=None,
                 loop=False):
        self.root = root
        self.battery = battery
        self.is_charging = charging
        self.temp = temp
        self.slept_ms = 0
        self.wifi = None
        self.mic = None
        self.loop = loop
        if wav is not None:
            self.mic = open(wav, "rb")
            self.data_start, self.data_len = wav_data(self.mic, wav)
            self.left = self.data_len
        self.stdin = stdin if stdin is not None else getattr(sys.stdin, "buffer", sys.stdin)
        self.stdout = stdout if stdout is not None else getattr(sys.stdout, "buffer", sys.stdout)
        try:
            import micropython
            micropython.kbd_intr(-1)
        except (ImportError, AttributeError):
            pass

    def read_audio(self, buf):
        """Fill ``buf`` (a bytes-like view, int16 LE) from the WAV; returns bytes read, 0 at its end."""
        if self.mic is None:
            return 0
        if self.left <= 0 and self.loop:
            self.mic.seek(self.data_start)
            self.left = self.data_len
        n = len(buf) if len(buf) < self.left else self.left
        k = self.mic.readinto(memoryview(buf)[:n]) or 0 if n else 0
        self.left -= k
        return k

    def battery_pct(self):
        return self.battery

    def charging(self):
        return self.is_charging

    def temp_c(self):
        return self.temp

    def light_sleep(self, ms):
        self.slept_ms += ms

    def deep_sleep(self, ms):
        self.slept_ms += ms

    def connect_wifi(self, ssid, password, timeout_ms=15000):
        self.wifi = ssid    # the unix port uses the host's network
        return True


def wav_data(f, name="WAV"):
    """(offset, length) of the PCM data of an open WAV; ValueError unless 16 kHz mono 16-bit PCM."""
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise ValueError("%s is not a WAV file" % name)
    fmt_ok = False
    while True:
        ck = f.read(8)
        if len(ck) < 8:
            raise ValueError("%s has no data chunk (truncated?)" % name)
        tag, size = ck[:4], struct.unpack("<I", ck[4:])[0]
        if tag == b"fmt ":
            fmt = f.read(size)
            codec, ch, rate = struct.unpack_from("<HHI", fmt, 0)
            bits = struct.unpack_from("<H", fmt, 14)[0]
            if (codec, ch, rate, bits) != (1, 1, 16000, 16):
                raise ValueError("%s is %d Hz, %d channel(s), %d-bit (codec %d); the board needs 16 kHz mono "
                                 "16-bit PCM" % (name, rate, ch, bits, codec))
            fmt_ok = True
        elif tag == b"data":
            if not fmt_ok:
                raise ValueError("%s has its data before its format chunk" % name)
            return f.tell(), size - size % 2
        else:
            f.seek(size + (size & 1), 1)


def make_board(**kw):
    """The board this code runs on: ``Esp32Board`` under MicroPython on an ESP32, else ``FakeBoard``."""
    if sys.platform == "esp32":
        from firmware.esp32_board import Esp32Board
        return Esp32Board(**kw)
    return FakeBoard(**kw)
