# Freeze manifest: the firmware and edge/portable compiled into an ESP32 image (code runs from flash).
# Read by MicroPython's build (it defines include() and package()), never imported by Python.
#
#   cd micropython/ports/esp32
#   make BOARD=ESP32_GENERIC FROZEN_MANIFEST=/path/to/edgelearn/host/board/manifest_freeze.py
#   # optional, the C FFT for the front end: USER_C_MODULES=/path/to/micropython-ulab/micropython.cmake
#
# Frozen bytecode, its constants and its interned names live in flash; only
# module dicts, function objects and data take heap. On the 64-bit unix port
# the same modules loaded as .mpy take 50.8 KB of heap resident plus 10 KB of
# interned names once every phase has run (tests/test_firmware_micropython.py);
# frozen, that goes to the objects a module creates when it runs (docs/firmware.md,
# "Memory"). The module list must equal host/board/manifest.py's PORTABLE and
# FIRMWARE (tests/test_firmware_manifest.py checks it). Deploy the bundle and
# config with `edgelearn flash` as usual; flash skips nothing, and a file
# module of the same name on the filesystem is shadowed by the frozen one only
# if ".frozen" comes first in sys.path (the default on ESP32). base_path is the
# directory that holds edge/ and firmware/ (the checkout, or site-packages when installed).

include("$(PORT_DIR)/boards/manifest.py")

PORTABLE = ("compat", "quant", "kernels", "mfcc", "model", "model_load", "proto", "replay", "schedule",
            "hmac256", "wire_errors", "wire_errors_rx", "wire_topk", "wire_encode", "wire", "wire_decode", "chunks", "chunks_rx",
            "link")
FIRMWARE = ("board", "esp32_board", "app", "install", "learn", "report", "checkin", "net", "wifi", "main")

package("edge", files=["__init__.py", "portable/__init__.py"] + ["portable/%s.py" % n for n in PORTABLE],
        base_path="../..", opt=2)
package("firmware", files=["__init__.py"] + ["%s.py" % n for n in FIRMWARE], base_path="../..", opt=2)
