"""edgelearn device runtime: front end, interpreter backends, keyword spotting.

Everything under ``edge`` runs on a Linux board with numpy and one interpreter;
nothing here imports TensorFlow. ``edge.portable`` also runs on MicroPython.
"""

__version__ = "0.1.0"
