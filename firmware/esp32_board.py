"""The ESP32 board: I2S microphone, battery ADC, die temperature, sleep, Wi-Fi, littlefs.

Imported only on a board (``firmware.board.make_board``), so the unix port
and the tests never load it. ``machine.I2S`` reads an I2S MEMS microphone
(16 kHz, 16-bit mono); the battery sits behind a 1:2 divider on an ADC1 pin
(``ADC.read_uv()``, calibrated; ADC2 is unusable while Wi-Fi runs); the die
temperature is ``esp32.mcu_temperature()`` on S2/S3/C3 and
``esp32.raw_temperature()`` (°F) on the original ESP32. The serial link is
the USB-UART REPL's stdin/stdout with Ctrl-C disabled.

    from firmware.esp32_board import Esp32Board
    board = Esp32Board()
    n = board.read_audio(pcm)          # pcm: array('h'); blocks until the DMA buffer has data
"""

import sys

from edge.portable.compat import const
from firmware.board import BoardBase

_MIC_SCK = const(14)
_MIC_WS = const(15)
_MIC_SD = const(32)
_BATT_PIN = const(35)        # ADC1_CH7; ADC2 pins read garbage while Wi-Fi is on
_BATT_EMPTY_UV = const(3300000)     # LiPo cell voltage (after the 1:2 divider it reads half)
_BATT_FULL_UV = const(4200000)


class Esp32Board(BoardBase):
    """An ESP32 with an I2S microphone, a battery divider and littlefs."""

    name = "esp32"

    def __init__(self, root="/"):
        import machine
        import micropython

        self.root = root
        self._machine = machine
        self.mic = machine.I2S(0, sck=machine.Pin(_MIC_SCK), ws=machine.Pin(_MIC_WS), sd=machine.Pin(_MIC_SD),
                               mode=machine.I2S.RX, bits=16, format=machine.I2S.MONO, rate=16000, ibuf=8192)
        self.adc = machine.ADC(machine.Pin(_BATT_PIN), atten=machine.ADC.ATTN_11DB)
        self.stdin = sys.stdin.buffer
        self.stdout = sys.stdout.buffer
        micropython.kbd_intr(-1)  # 0x03 inside a binary frame must not raise KeyboardInterrupt

    def read_audio(self, buf):
        """Fill ``buf`` (int16 LE mono) from the microphone; returns bytes read."""
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

    def connect_wifi(self, ssid, password, timeout_ms=15000):
        """Join ``ssid``; True when connected within ``timeout_ms``."""
        import network
        import time
        wlan = network.WLAN(network.STA_IF)
        wlan.active(True)
        if not wlan.isconnected():
            wlan.connect(ssid, password)
            t0 = time.ticks_ms()
            while not wlan.isconnected() and time.ticks_diff(time.ticks_ms(), t0) < timeout_ms:
                time.sleep_ms(100)
        return wlan.isconnected()
