"""Aggregator settings: one dataclass, stored as ``config.json`` in the state directory.

    cfg = AggregatorConfig(mode="sync", clients_per_round=10, overselect=1.3)
    cfg.save("agg/config.json"); AggregatorConfig.load("agg/config.json")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from edge.adapt.strategies import STRATEGIES as ADAPT_STRATEGIES
from edge.errors import EdgelearnError
from edge.atomic import atomic_write


CODECS = ("dense_f32", "int8", "topk_int8")  # the update codecs a round may ask for (docs/wire-format.md)
FAIRNESS_COUNTS = ("selections", "contributions")
UPDATE_WEIGHTS = ("examples", "update", "device")


@dataclass
class AggregatorConfig:
    mode: str = "sync"                 # "sync" rounds or "async" (FedBuff)
    strategy: str = "fedavg"
    strategy_options: dict = field(default_factory=dict)
    clients_per_round: int = 10        # quorum: the round closes when this many updates arrived
    overselect: float = 1.3            # select at least this many times the quorum (stragglers and drop-outs)
    max_overselect: float = 3.0        # ... and at most this many, as observed drop-outs and latency demand
    min_updates: int = 0               # at the deadline, close with at least this many (0: half the quorum)
    round_timeout: float = 120.0       # seconds from opening to the deadline
    buffer_size: int = 10              # FedBuff: aggregate every K updates
    max_staleness: int = 5             # FedBuff: reject updates from more than this many versions ago
    max_concurrency: int = 30          # FedBuff: tasks out at once
    # eligibility (Bonawitz et al. 2019: idle, charging, unmetered; here thresholds a deployment can tune)
    min_battery: float = 0.5
    allow_metered: bool = False
    max_temperature: float = 45.0
    tiers: list = field(default_factory=lambda: ["linux", "mcu"])
    # fairness: a device joins at most `max_rounds_per_window` of the last `fairness_window` rounds,
    # counting (`fairness_counts`) the rounds that gave it a task ("selections": paces its training) or
    # the rounds that accepted its update ("contributions": bounds its share of what rounds hear; a slow
    # device whose upload came too late keeps its turn)
    fairness_window: int = 10
    max_rounds_per_window: int = 5
    fairness_counts: str = "selections"
    # how much one accepted update counts in a round's mean (FedAvg family): "examples" (its example
    # count, McMahan et al. 2017), "update" (1 each), "device" (each device about once per
    # `fairness_window` rounds however often it answers first: 1 / (1 + the earlier rounds of the window
    # that accepted its update)); the server knows only which device sent what, never who speaks
    update_weight: str = "examples"
    # pace steering
    min_retry: float = 5.0
    max_retry: float = 3600.0
    # local training, sent with each task
    local_epochs: int = 2
    learning_rate: float = 0.1
    batch_size: int = 16
    codec: str = "int8"                # "dense_f32" | "int8" | "topk_int8"
    topk_fraction: float = 0.05
    adapt_strategy: str = ""           # edge.adapt strategy for clients ("bias-only" sends subset frames); "" = client default
    # input limits
    max_frame_len: int = 262144
    max_update_norm: float = 100.0     # L2 norm of a delta above this is rejected (422)
    max_examples: int = 100000
    chunk_size: int = 16384
    checkin_max_skew: float = 0.0      # > 0: refuse check-ins dated further than this from our clock
    # differential privacy (user level); 0 = off
    dp_clip: float = 0.0
    dp_noise: float = 0.0
    dp_delta: float = 1e-5
    # True: DP noise drawn from the public `seed` (the same for every aggregator with this config), for
    # reproducible experiments and benchmarks ONLY: whoever knows the config can subtract the noise.
    # False (default): drawn from a secret the database holds (meta `dp_seed`, made at init).
    dp_reproducible: bool = False
    # secure aggregation (pairwise masking, Linux clients; sync rounds with FedAvg-family strategies)
    secure_aggregation: bool = False
    secagg_threshold: float = 0.6      # of the devices that advertised keys; always more than half
    secagg_frac_bits: int = 16         # fixed point: |sum of weighted values| must stay below 2^(31 - bits)
    secagg_phase_timeout: float = 30.0
    # publication
    eval_tolerance: float = 0.01       # reject an aggregate that loses more held-out accuracy than this
    # what is lost: "accuracy" (plain, over the held-out set) or "balanced" (the mean of each label's
    # recall: a held-out set that is mostly one label, e.g. `_unknown_`, otherwise hides the others)
    eval_metric: str = "accuracy"
    # lost against what: "current" (the version the round started from; small losses can add up over
    # rounds) or "start" (the first version the aggregator published: the model federation began with)
    eval_against: str = "current"
    # an aggregate that fails the gate: publish instead the current version moved only this fraction of
    # the way toward it, the first fraction (in the order given) that passes; [] = reject it whole. A
    # step that would cost one voice more than the tolerance often carries a smaller one that does not
    # (with a gate per voice group, most rounds fail whole: docs/protocol.md)
    eval_shrink: list = field(default_factory=list)
    synchronous: str = "full"          # SQLite: "full" survives a power cut, "normal" a process crash
    seed: int = 0
    # the --db `init` was given (sqlite:////ABS/PATH, or a postgresql:// URL without a password), used
    # when a later command gives none; "" = STATE/state.sqlite (``host.aggregator.store.state_db``)
    db: str = ""

    def __post_init__(self):
        problems = []
        if self.mode not in ("sync", "async"):
            problems.append(f"mode={self.mode!r} (use sync or async)")
        if self.eval_metric not in ("accuracy", "balanced"):
            problems.append(f"eval_metric={self.eval_metric!r} (use accuracy or balanced)")
        if self.eval_against not in ("current", "start"):
            problems.append(f"eval_against={self.eval_against!r} (use current or start)")
        shrink = self.eval_shrink
        if not isinstance(shrink, (list, tuple)) or not all(
                isinstance(a, (int, float)) and not isinstance(a, bool) and 0 < a < 1 for a in shrink):
            problems.append(f"eval_shrink={self.eval_shrink!r} (a list of fractions between 0 and 1, e.g. [0.5, 0.25])")
        for name in ("clients_per_round", "buffer_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.overselect < 1 or self.max_overselect < self.overselect:
            problems.append(f"overselect={self.overselect}, max_overselect={self.max_overselect}: "
                            "need 1 <= overselect <= max_overselect")
        if self.fairness_counts not in FAIRNESS_COUNTS:
            problems.append(f"fairness_counts={self.fairness_counts!r} (use {' or '.join(FAIRNESS_COUNTS)})")
        if self.update_weight not in UPDATE_WEIGHTS:
            problems.append(f"update_weight={self.update_weight!r} (use {', '.join(UPDATE_WEIGHTS)})")
        if self.fairness_window < 1 or self.max_rounds_per_window < 1:
            problems.append(f"fairness_window={self.fairness_window}, max_rounds_per_window="
                            f"{self.max_rounds_per_window}: both must be >= 1 (a budget of 0 rounds selects nobody)")
        if self.secure_aggregation and self.update_weight != "examples":
            problems.append(f"update_weight={self.update_weight!r} with secure_aggregation: the server never sees "
                            "an individual update to weight (devices weight their masked input by their example "
                            "count); use update_weight=examples")
        if self.codec not in CODECS:
            problems.append(f"codec={self.codec!r}")
        if self.adapt_strategy not in ("", *ADAPT_STRATEGIES):
            problems.append(f"adapt_strategy={self.adapt_strategy!r}")
        if not 0 < self.topk_fraction <= 1:
            problems.append(f"topk_fraction={self.topk_fraction}")
        if self.round_timeout <= 0:
            problems.append("round_timeout must be > 0")
        if self.secure_aggregation and (self.mode != "sync" or self.strategy in ("trimmed_mean", "median")):
            problems.append("secure_aggregation needs mode=sync and a FedAvg-family strategy (trimmed mean and "
                            "median need individual updates, which secure aggregation hides)")
        if not 0.5 <= self.secagg_threshold <= 1 or not 4 <= self.secagg_frac_bits <= 24:
            problems.append("secagg_threshold must be in [0.5, 1] and secagg_frac_bits in [4, 24]")
        if problems:
            raise EdgelearnError("aggregator config: " + "; ".join(problems), fix="fix config.json")

    @property
    def quorum_floor(self) -> int:
        return self.min_updates or max(1, (self.clients_per_round + 1) // 2)

    def save(self, path) -> None:
        atomic_write(Path(path), (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode())

    @classmethod
    def load(cls, path) -> "AggregatorConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise EdgelearnError(f"{path}: cannot read the aggregator config ({e})",
                                 fix="run `edgelearn aggregator init` first") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise EdgelearnError(f"{path}: unknown settings {unknown}", fix=f"known settings: {sorted(known)}")
        return cls(**raw)


def shared_config(store) -> AggregatorConfig:
    """The config every replica of a shared database runs with (``init`` put it there)."""
    raw = store.get_meta("config")
    if raw is None:
        raise EdgelearnError(f"{store.url} holds no aggregator",
                             fix="run `edgelearn aggregator init --db URL` first")
    return AggregatorConfig(**json.loads(raw))
