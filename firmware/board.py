"""Everything board-specific in one place; the rest of the firmware runs on the unix port too.

``Esp32Board`` uses ``machine.I2S`` (an I2S MEMS microphone, 16 kHz, 16-bit
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
import sys

from edge.portable.compat import const

_MIC_SCK = const(14)
_MIC_WS = const(15)
_MIC_SD = const(32)
_BATT_PIN = const(35)        # ADC1_CH7; ADC2 pins read garbage while Wi-Fi is on
_BATT_EMPTY_UV = 3300000     # LiPo cell voltage (after the 1:2 divider it reads half)
_BATT_FULL_UV = 4200000
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


class Esp32Board:
    """An ESP32 with an I2S microphone, a battery divider and littlefs."""

    name = "esp32"

    def __init__(self, root="/"):
        import machine

        self.root = root
        self._machine = machine
        self.mic = machine.I2S(0, sck=machine.Pin(_MIC_SCK), ws=machine.Pin(_MIC_WS), sd=machine.Pin(_MIC_SD),
                               mode=machine.I2S.RX, bits=16, format=machine.I2S.MONO, rate=16000, ibuf=8192)
        self.adc = machine.ADC(machine.Pin(_BATT_PIN), atten=machine.ADC.ATTN_11DB)
        self.stdin = sys.stdin.buffer
        self.stdout = sys.stdout.buffer
        import micropython
        micropython.kbd_intr(-1)  # 0x03 inside a binary frame must not raise KeyboardInterrupt

    def read_audio(self, buf):
        """Fill ``buf`` (bytearray, int16 LE mono) from the microphone; returns bytes read."""
        return self.mic.readinto(buf)

    def battery_pct(self):
        uv = 2 * self.adc.read_uv()
        pct = (uv - _BATT_EMPTY_UV) * 100 // (_BATT_FULL_UV - _BATT_EMPTY_UV)
        return 0 if pct < 0 else (100 if pct > 100 else pct)

    def charging(self):
        return None  # no charge-status pin on the reference wiring: the policy treats it as unknown

    def temp_c(self):
        import esp32
        if hasattr(esp32, "mcu_temperature"):
            return float(esp32.mcu_temperature())
        return (esp32.raw_temperature() - 32) / 1.8

    def light_sleep(self, ms):
        self._machine.lightsleep(ms)

    def deep_sleep(self, ms):
        self._machine.deepsleep(ms)

    def path(self, name):
        return self.root + name

    def ensure_dirs(self):
        _mkdir(self.path("state"))
        _mkdir(self.path("bundle"))


class FakeBoard:
    """The unix port's stand-in: readings are attributes, audio comes from a buffer, files from a directory."""

    name = "fake"

    def __init__(self, root="", battery=90, charging=True, temp=35.0, stdin=None, stdout=None):
        self.root = root
        self.battery = battery
        self.is_charging = charging
        self.temp = temp
        self.audio = None
        self.audio_pos = 0
        self.slept_ms = 0
        self.stdin = stdin if stdin is not None else getattr(sys.stdin, "buffer", sys.stdin)
        self.stdout = stdout if stdout is not None else getattr(sys.stdout, "buffer", sys.stdout)
        try:
            import micropython
            micropython.kbd_intr(-1)
        except (ImportError, AttributeError):
            pass

    def read_audio(self, buf):
        if self.audio is None:
            return 0
        n = min(len(buf), len(self.audio) - self.audio_pos)
        buf[0:n] = self.audio[self.audio_pos:self.audio_pos + n]
        self.audio_pos += n
        return n

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

    def path(self, name):
        return self.root + name

    def ensure_dirs(self):
        _mkdir(self.path("state"))
        _mkdir(self.path("bundle"))


def make_board(**kw):
    """The board this code runs on: ``Esp32Board`` under MicroPython on an ESP32, else ``FakeBoard``."""
    if sys.platform == "esp32":
        return Esp32Board(**kw)
    return FakeBoard(**kw)
