"""A simulated population that exists only as a function of (device index, seed): memory flat in
the number of devices not in a round.

Nothing is kept per device between its rounds. When device ``i`` is scheduled, its id
(``dev<i>``), HMAC key (``device_key``), rows of the embedding set (``PartitionIndex.rows``),
slow flag, charging phase and battery at the simulated hour (``DerivedDevice``) and the randomness
of its round (latency, drop-out) are derived from ``i`` and the seed; the one piece of persisted
device state the protocol needs across rounds, the last frame sequence number, is derived from the
clock (``derived_seq``: milliseconds since the run started, strictly increasing for a device that is
scheduled again later). The aggregator still holds one row per device (its key), written in bulk
(``provision_population``), on disk.

    index = PartitionIndex(load_embeddings(), seed=0)
    X, y = data.X[index.rows(41)], data.y[index.rows(41)]      # device 41's examples, every time
    offsets, rows = index.partition(10_000)                     # the whole population's, for a peer
    DerivedDevice(41, cfg).status(t_sim=7200.0)                 # {"battery": ..., "charging": ...}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path

import numpy as np

KEY_SALT = b"edgelearn fleet simulation key"
N_CLASSES = 37


def check_clients(cfg) -> None:
    """One EdgelearnError when a round's quorum (``clients_per_round``) exceeds the population
    (``devices``): such a round could never close. Every simulator (threads, Ray, lockstep) and
    ``fleet simulate`` check it before any work."""
    if cfg.clients_per_round > cfg.devices:
        from edge.errors import EdgelearnError
        raise EdgelearnError(f"{cfg.clients_per_round} clients per round from {cfg.devices} devices: a round "
                             "could never reach its quorum",
                             fix=f"pass --clients-per-round {cfg.devices} or fewer, or use at least as many "
                                 "devices as clients per round")


def device_id(i: int) -> str:
    return f"dev{int(i)}"


def device_key(seed: int, i: int) -> bytes:
    """Device ``i``'s 32-byte HMAC key, derived (simulation only: anyone who knows the seed has it)."""
    return hmac.new(KEY_SALT + str(int(seed)).encode(), device_id(i).encode(), hashlib.sha256).digest()


def provision_population(state_dir, n: int, seed: int, chunk: int = 20000) -> None:
    """Register devices ``dev0 .. dev<n-1>`` with their derived keys in the aggregator's database:
    what ``host.aggregator.setup.provision`` writes for one device, ``chunk`` devices per transaction
    (provision opens the store once per device: ~2 ms each, minutes for 100,000)."""
    from host.aggregator.store import Store

    store = Store(Path(state_dir) / "state.sqlite")
    try:
        for a in range(0, n, chunk):
            with store.tx() as c:
                c.executemany("INSERT INTO devices(device_id, key, tier) VALUES(?,?,?)",
                              ((device_id(i), device_key(seed, i), "linux") for i in range(a, min(n, a + chunk))))
    finally:
        store.close()


def init_population(out_dir, acfg, n: int, seed: int, params: dict, heldout) -> Path:
    """An aggregator state ``out_dir/agg`` (``init_state``) with the population provisioned; its path."""
    from host.aggregator.setup import init_state

    state = Path(out_dir) / "agg"
    init_state(state, acfg, params=params, heldout=heldout)
    provision_population(state, n, seed)
    return state


class PartitionIndex:
    """Each device's rows, from its index: device ``i`` is voice ``i mod V`` (the train split's
    voices, shuffled by the seed) and keeps the clips of that voice for a random ``words_per_device``
    of the words plus its silence/unknown clips (at most ``max_rows``, sampled), and 3 noise clips:
    the non-IID skew of ``host.fleet.data.partition_noniid``, for any population (devices that share
    a voice overlap; partition_noniid splits a voice between them, so it cannot reach 10,000)."""

    def __init__(self, data, seed: int = 0, split: str = "train", words_per_device: int = 12,
                 max_rows: int = 32):
        from edge.errors import EdgelearnError

        rows = data.rows(split)
        voices = sorted(set(data.voice[rows]) - {"noise"})
        if not voices:
            raise EdgelearnError(f"no {split!r} voices in the embedding set", fix="rebuild the corpus")
        np.random.default_rng(seed).shuffle(voices)
        self.seed, self.words, self.max_rows = int(seed), int(words_per_device), int(max_rows)
        self.by_voice = [rows[data.voice[rows] == v] for v in voices]
        self.labels = [np.asarray(data.y[r]) for r in self.by_voice]
        self.noise = rows[data.voice[rows] == "noise"]

    def rows(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(i), 7])
        v = int(i) % len(self.by_voice)
        mine, lab = self.by_voice[v], self.labels[v]
        words = rng.choice(N_CLASSES, size=min(self.words, N_CLASSES), replace=False)
        keep = mine[np.isin(lab, words) | (lab >= N_CLASSES - 2)]
        if keep.size > self.max_rows:
            keep = np.sort(rng.choice(keep, self.max_rows, replace=False))
        sil = rng.choice(self.noise, size=min(3, self.noise.size), replace=False) if self.noise.size else []
        return np.concatenate([keep, np.asarray(sil, dtype=keep.dtype)])

    def partition(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, rows) of devices 0..n-1 (device i: ``rows[offsets[i]:offsets[i + 1]]``)."""
        parts = [self.rows(i) for i in range(n)]
        return np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64), np.concatenate(parts)


class DerivedDevice:
    """A device's simulated state from its index: slow (10x latency) or not, its charging phase and
    battery drain; ``status(t_sim)`` is its check-in state at that simulated second (overnight on
    the charger for 8 h, draining from full after that), ``rng(round)`` the randomness of one round."""

    def __init__(self, i: int, cfg):
        self.i, self.seed = int(i), int(cfg.seed)
        r = np.random.default_rng([self.seed, self.i])
        self.slow = bool(r.random() < cfg.slow_fraction)
        self.phase = float(r.uniform(0, 24))
        self.drain = float(r.uniform(0.02, 0.06))  # battery per hour off the charger

    def status(self, t_sim: float) -> dict:
        hour = (t_sim / 3600 + self.phase) % 24
        charging = hour < 8
        battery = 1.0 if charging else max(0.05, 1.0 - self.drain * (hour - 8))
        return {"battery": round(battery, 3), "charging": charging, "network": "wifi", "temperature": 30.0}

    def rng(self, round_key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.i, int(round_key), 1])


def derived_seq(t0_wall: float) -> int:
    """The last frame sequence number a device scheduled now has used: milliseconds since the run
    began (uint32 lasts 49 days); the next frame's is one more, newer than any earlier round's."""
    return int((time.time() - t0_wall) * 1000)


def write_device_state(state_dir, t0_wall: float) -> None:
    """The persisted part of a derived device's client state (``FLClient``'s ``fl_state.json``), in a
    fresh directory. A plain write: it is derived again whenever the device is scheduled."""
    d = Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "fl_state.json").write_text(json.dumps({"seq": derived_seq(t0_wall)}))


class VisitOrder:
    """The order devices check in during one scheduling epoch: ``i -> (a * i + b) mod n`` with
    ``gcd(a, n) = 1``, a permutation of the population that needs no array of it."""

    def __init__(self, n: int, seed: int, epoch: int):
        from math import gcd

        r = np.random.default_rng([int(seed), int(epoch), 3])
        self.n = int(n)
        a = int(r.integers(1, max(2, self.n)))
        while gcd(a, self.n) != 1:
            a += 1
        self.a, self.b, self.k = a, int(r.integers(0, self.n)), 0

    def take(self, m: int) -> list[int]:
        """The next ``m`` device indices (fewer once every device was visited)."""
        m = max(0, min(m, self.n - self.k))
        out = [(self.a * (self.k + j) + self.b) % self.n for j in range(m)]
        self.k += m
        return out
