"""``AgentConfig``: what ``edgelearn device run`` was asked to do, one field per option (the agent,
``edge.agent``, which re-exports it; ``edge.agent_unit`` turns it back into options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class AgentConfig:
    """What ``edgelearn device run`` was asked to do (one field per option)."""
    source: object = "mic"         # "mic", "stdin", "none" (no local audio: --wyoming alone), a WAV path,
                                   # or (Python) an iterable of int16 chunks
    mic_device: str | None = None  # the ALSA capture device of "mic" (None: ALSA's default)
    on_detect: str | None = None   # a shell command run for every detection
    keywords: object = None        # base keywords to report (None: the bundle's commands; "all")
    threshold: object = None
    sensitivity: float | None = None
    confirm: float = 0.9
    asr: bool | str = "auto"       # the base commands' second stage: "auto" (the default's, edge.device_detect),
    #                                True (PocketSphinx, edge/confirm.py), "phrase" (edge/phrase_stage.py), False
    data: Path | None = None       # labelled clips DIR/<label>/*.wav: adaptation, federated examples, health check
    strategy: str = "bias-only"
    keep_versions: int | None = None  # adapted versions kept besides current and previous (None: 10)
    adapt_every_s: float = 3600.0  # how often to ask the scheduler for an adaptation run
    adapt: bool = True             # False: never adapt locally (detect, and federate with --data's clips)
    aggregator: str | None = None  # http://host:port
    device_id: str | None = None
    device_key: Path | None = None
    checkin_every_s: float = 600.0
    status_every_s: float = 10.0
    network: str = "wifi"
    extra_env: dict = field(default_factory=dict)
    wyoming: str | None = None     # also serve the keywords to Home Assistant here (tcp://HOST:PORT)
    zeroconf: object = False       # announce that server on mDNS: True (default name) or a name
