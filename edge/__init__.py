"""edgelearn device runtime: front end, interpreter backends, keyword spotting.

Everything under ``edge`` runs on a Linux board with numpy and one interpreter;
nothing here imports TensorFlow. ``edge.portable`` also runs on MicroPython.

What a script uses (README, "Python API"), imported on first use so ``import edge`` stays cheap:

    >>> import edge
    >>> dev = edge.Device("state/")                        # the shipped, signed model
    >>> dev.enroll("hey edge", ["a.wav", "b.wav", "c.wav"])
    >>> for event in dev.detect("long.wav"):
    ...     print(event)
"""

__version__ = "0.1.0"

# public name -> the module that defines it. (``edge.enroll.enroll`` is not among them: the
# name ``edge.enroll`` is the module; ``Device.enroll`` is the call a script makes.)
_EXPORTS = {
    "Device": "edge.device",
    "load_bundle": "edge.bundle",
    "KeywordModel": "edge.kws",
    "Detector": "edge.detect",
    "DeviceState": "edge.keywords",
    "OperatingPoints": "edge.operating",
    "EdgelearnError": "edge.errors",
    "BundleError": "edge.errors",
    "AudioError": "edge.errors",
}
__all__ = ["AudioError", "BundleError", "Detector", "Device", "DeviceState", "EdgelearnError", "KeywordModel",
           "OperatingPoints", "load_bundle"]  # = sorted(_EXPORTS), by test


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edge' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
