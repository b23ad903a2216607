"""Secure aggregation, the server side: one session per round that only ever learns the sum.

The session relays keys and encrypted shares, collects masked inputs, and
with the unmasking shares of at least ``threshold`` survivors removes the
self masks of the survivors and the pairwise masks left by devices that
dropped after sharing keys (edge/secagg.py has the protocol). Each phase
closes when every device of the previous one answered or when the caller
closes it (the aggregator does at a phase deadline); a phase that closes with
fewer than ``threshold`` devices fails the session with ``SecAggError``.

Combines with FedAvg-family strategies and DP (both need only the sum: the
client sends ``[w·delta, w]`` so the example-weighted mean is one division,
and under DP w = 1 with the clipping done on the device and noise added to
the sum); not with trimmed mean or median, which need individual updates.

    s = SecAggSession(round_id=7, threshold=6, dim=6566)
    s.advertise("pi-001", keys); ...; s.close_phase()          # roster
    total = s.result()                                          # uint32 sum of the survivors' inputs
"""

from __future__ import annotations

import numpy as np

from edge.secagg import SecAggError, agree, client_vector, decode_fixed, encode_fixed, prg, shamir_join

PHASES = ("advertise", "share", "masked", "unmask", "done")


def fold_sum(acc, total: np.ndarray, names: list, frac_bits: int, count: int) -> None:
    """Put an unmasked ``[Σ w·delta, Σ w]`` into a strategy accumulator (``WeightedSum`` layout)."""
    vec = decode_fixed(total, frac_bits)
    if getattr(acc, "rows", None) is not None:
        raise SecAggError("robust strategies (trimmed mean, median) need individual updates; secure "
                          "aggregation reveals only their sum", fix="use fedavg, fedavgm or fedprox")
    at = 0
    for k in names:
        n = int(np.prod(acc.shapes[k]))
        acc.sums[k] += vec[at:at + n].reshape(acc.shapes[k])
        acc.weights[k] += vec[-1]
        at += n
    acc.count += count


class SecAggSession:
    """Server state of one secure-aggregation round (in memory: a restart aborts the round, as in the paper)."""

    def __init__(self, round_id: int, threshold: int, dim: int):
        if threshold < 2:
            raise SecAggError(f"threshold {threshold}: secure aggregation needs at least 2 devices",
                              fix="raise clients_per_round")
        self.round_id, self.t, self.dim = round_id, threshold, dim
        self.phase = "advertise"
        self.keys: dict = {}        # U1: device -> {"c_pk", "s_pk"}
        self.shares: dict = {}      # U2: sender -> {receiver: ciphertext}
        self.masked: dict = {}      # U3: device -> uint32 vector
        self.unmasks: dict = {}     # U4: device -> {"b": {...}, "s_sk": {...}}
        self.u1 = self.u2 = self.u3 = None
        self.total = None

    # --- messages ---------------------------------------------------------------------------------
    def _expect(self, phase, dev, allowed):
        if self.phase != phase:
            raise SecAggError(f"round {self.round_id} is in phase {self.phase!r}, not {phase!r}",
                              fix="poll the session state and send the message of the current phase")
        if allowed is not None and dev not in allowed:
            raise SecAggError(f"device {dev!r} dropped out of secure round {self.round_id} earlier",
                              fix="wait for the next round")

    def advertise(self, dev: str, keys: dict) -> None:
        self._expect("advertise", dev, None)
        if set(keys) != {"c_pk", "s_pk"} or any(len(bytes.fromhex(str(v))) != 32 for v in keys.values()):
            raise SecAggError("advertise needs c_pk and s_pk, 32-byte X25519 keys in hex", fix="send advertise()")
        self.keys.setdefault(dev, {k: str(v) for k, v in keys.items()})

    def share(self, dev: str, out: dict) -> None:
        self._expect("share", dev, self.u1)
        if set(out) != set(self.u1) - {dev}:
            raise SecAggError(f"{dev!r} sent shares for {len(out)} devices; the roster has {len(self.u1) - 1} others",
                              fix="share with every other device of the roster")
        self.shares.setdefault(dev, {v: str(c) for v, c in out.items()})

    def mask(self, dev: str, y: np.ndarray) -> None:
        self._expect("masked", dev, self.u2)
        y = np.asarray(y)
        if y.dtype != np.uint32 or y.shape != (self.dim,):
            raise SecAggError(f"masked input of shape {y.shape} {y.dtype}; expected ({self.dim},) uint32",
                              fix="mask the vector the task describes")
        self.masked.setdefault(dev, y.copy())

    def unmask(self, dev: str, shares: dict) -> None:
        self._expect("unmask", dev, self.u3)
        b, s = shares.get("b", {}), shares.get("s_sk", {})
        if set(b) != set(self.u3) or set(s) != set(self.u2) - set(self.u3):
            raise SecAggError("unmasking shares must cover exactly the survivors (b) and the dropped (s_sk)",
                              fix="answer the survivor list the server sent")
        self.unmasks.setdefault(dev, {"b": {k: int(v, 16) for k, v in b.items()},
                                      "s_sk": {k: int(v, 16) for k, v in s.items()}})

    # --- what devices read ------------------------------------------------------------------------
    def roster(self):
        return None if self.u1 is None else {d: self.keys[d] for d in self.u1}

    def inbox(self, dev: str):
        if self.u2 is None:
            return None
        return {u: out[dev] for u, out in self.shares.items() if u in self.u2 and u != dev}

    def survivors(self):
        return None if self.u3 is None else sorted(self.u3)

    # --- phase changes ----------------------------------------------------------------------------
    def ready(self) -> bool:
        """Every device of the previous phase has answered this one."""
        prev = {"advertise": None, "share": self.u1, "masked": self.u2, "unmask": self.u3}.get(self.phase)
        got = {"advertise": self.keys, "share": self.shares, "masked": self.masked, "unmask": self.unmasks}.get(self.phase)
        return prev is not None and got is not None and set(got) >= set(prev)

    def close_phase(self) -> None:
        """End the current phase with whoever answered; fails (SecAggError) below the threshold."""
        got = {"advertise": self.keys, "share": self.shares, "masked": self.masked, "unmask": self.unmasks}[self.phase]
        if len(got) < self.t:
            phase, self.phase = self.phase, "failed"
            raise SecAggError(f"secure round {self.round_id}: {len(got)} devices answered {phase!r}, "
                              f"below the threshold {self.t}; no sum is revealed", fix="the round fails; open the next")
        names = frozenset(got)
        if self.phase == "advertise":
            self.u1 = names
        elif self.phase == "share":
            self.u2 = names
        elif self.phase == "masked":
            self.u3 = names
        else:
            self.total = self._unmask()
        self.phase = PHASES[PHASES.index(self.phase) + 1]

    def _unmask(self) -> np.ndarray:
        idx = {d: i + 1 for i, d in enumerate(sorted(self.u1))}
        total = np.zeros(self.dim, np.uint32)
        for y in (self.masked[d] for d in self.u3):
            total += y
        for v in self.u3:  # remove each survivor's self mask
            b = shamir_join({idx[u]: m["b"][v] for u, m in self.unmasks.items()})
            total -= prg(b, self.dim)
        for v in self.u2 - self.u3:  # the dropped: rebuild their masking key, cancel their pairwise masks
            s_sk = shamir_join({idx[u]: m["s_sk"][v] for u, m in self.unmasks.items()})
            for w in self.u3:
                m = prg(agree(s_sk, bytes.fromhex(self.keys[w]["s_pk"]), b"edgelearn-secagg-mask"), self.dim)
                total = total + m if v < w else total - m  # w added +m when w < v and -m when w > v
        return total

    def result(self) -> np.ndarray:
        if self.total is None:
            raise SecAggError(f"secure round {self.round_id} has no result yet (phase {self.phase!r})",
                              fix="close the unmasking phase first")
        return self.total


__all__ = ["SecAggSession", "SecAggError", "client_vector", "fold_sum", "encode_fixed"]
