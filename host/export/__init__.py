"""Exports of a custom keyword to other wake-word runtimes.

``esphome``: a streaming int8 TFLite model and its v2 JSON manifest for ESPHome's
``micro_wake_word`` (the format microWakeWord's released models use), trained on the host
from the synthetic corpus plus the user's own clips (``edgelearn export esphome``).
"""
