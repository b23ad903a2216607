"""Secure aggregation by pairwise masking (Bonawitz et al. 2017), the client side and shared math.

The server learns only the sum of the updates of the devices that finished,
even when some drop out after masking. Each device, per round:

1. ``advertise()``: two fresh X25519 public keys (one to encrypt shares, one to mask).
2. ``share_keys(roster, t)``: Shamir-shares (threshold ``t``) its masking private key and a
   self-mask seed to every other device, each share AES-GCM-encrypted to that device.
3. ``masked_input(inbox, x)``: its fixed-point update x (uint32) plus PRG(self seed) plus, for
   every other device v, ±PRG(X25519 shared secret with v) — all mod 2^32. Pairwise masks cancel
   in the sum; the self mask stops a late device's update from being unmasked alone.
4. ``unmask(survivors)``: for devices that sent a masked input, its share of their self seed;
   for those that dropped, its share of their masking key (never both for one device), so the
   server, with ``t`` of these, removes exactly the masks left in the sum.

Masks come from AES-256-CTR keyed by the 32-byte seed (a PRG as in the paper); shares live in
GF(2^521 - 1). Needs ``cryptography``: Linux clients only (docs/protocol.md says why not MCUs).

    c = SecAggClient("pi-001", round_id=7)
    keys = c.advertise()                                   # -> server; roster <- server
    out = c.share_keys(roster, threshold=6)                # {device: ciphertext hex} -> server
    y = c.masked_input(inbox, encode_fixed(vec, 16))       # uint32 -> server
    shares = c.unmask(survivors)                           # -> server
"""

from __future__ import annotations

import secrets

import numpy as np

from edge.errors import EdgelearnError

PRIME = (1 << 521) - 1  # a Mersenne prime above every 32-byte secret
MOD_BITS = 32


class SecAggError(EdgelearnError):
    """The secure-aggregation protocol cannot go on (too few devices, a bad message)."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:  # pragma: no cover - the device runtime may lack it
        raise SecAggError("secure aggregation needs the `cryptography` package",
                          fix="pip install cryptography, or join rounds without secure aggregation") from None
    return hashes, serialization, X25519PrivateKey, X25519PublicKey, Cipher, algorithms, modes, AESGCM, HKDF


# --- primitives -----------------------------------------------------------------------------------

def agree(private_raw: bytes, public_raw: bytes, info: bytes) -> bytes:
    """32-byte key from X25519(private, public) through HKDF-SHA256 (``info`` separates uses)."""
    hashes, _, Priv, Pub, *_rest, HKDF = _crypto()
    try:
        shared = Priv.from_private_bytes(private_raw).exchange(Pub.from_public_bytes(public_raw))
    except ValueError as e:
        raise SecAggError(f"bad X25519 key ({e})", fix="send the 32-byte raw public keys from advertise()") from None
    return HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(shared)


def prg(seed: bytes, n: int) -> np.ndarray:
    """``n`` pseudorandom uint32 from AES-256-CTR keyed by ``seed`` (zero nonce: one key, one stream)."""
    *_a, Cipher, algorithms, modes, _g, _h = _crypto()
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(enc.update(b"\0" * (4 * n)) + enc.finalize(), dtype="<u4").astype(np.uint32)


def shamir_split(secret: bytes, n: int, t: int) -> list[int]:
    """Shares 1..n (share i is the polynomial at x=i) of a secret of at most 64 bytes; any t rebuild it."""
    if not 1 <= t <= n:
        raise SecAggError(f"threshold {t} for {n} shares", fix="use 1 <= threshold <= devices")
    coef = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    out = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coef):  # Horner
            y = (y * x + c) % PRIME
        out.append(y)
    return out


def shamir_join(shares: dict[int, int], length: int = 32) -> bytes:
    """The secret from {x: y} shares (Lagrange interpolation at 0); needs at least the threshold."""
    xs = list(shares)
    s = 0
    for i in xs:
        num, den = 1, 1
        for j in xs:
            if j != i:
                num = num * (-j) % PRIME
                den = den * (i - j) % PRIME
        s = (s + shares[i] * num * pow(den, -1, PRIME)) % PRIME
    if s >> (8 * length):
        raise SecAggError("shares do not rebuild a secret (too few or inconsistent)",
                          fix="collect at least the threshold of honest shares")
    return s.to_bytes(length, "big")


def encode_fixed(vec, frac_bits: int = 16) -> np.ndarray:
    """float vector -> uint32 two's complement fixed point with ``frac_bits`` fraction bits."""
    v = np.asarray(vec, np.float64)
    if not np.all(np.isfinite(v)):
        raise SecAggError("update holds NaN or infinity", fix="drop the diverged update")
    q = np.rint(v * (1 << frac_bits))
    lim = float(1 << (MOD_BITS - 1))
    if np.any(np.abs(q) >= lim):
        raise SecAggError(f"update value {float(np.max(np.abs(v))):.4g} overflows {MOD_BITS}-bit fixed point "
                          f"with {frac_bits} fraction bits", fix="clip the update or lower frac_bits")
    return q.astype(np.int64).astype(np.uint32)


def decode_fixed(total: np.ndarray, frac_bits: int = 16) -> np.ndarray:
    """uint32 sum mod 2^32 -> float64 (correct while the true sum stays within ±2^31 / 2^frac_bits)."""
    return np.asarray(total, np.uint32).view(np.int32).astype(np.float64) / (1 << frac_bits)


def client_vector(delta: dict, weight: float, names: list, shapes: dict, frac_bits: int) -> np.ndarray:
    """What a device masks: fixed-point ``[weight × delta (tensors of names in order)..., weight]``;
    tensors it did not train (subset updates) are zeros."""
    flat = np.concatenate([np.asarray(delta[k], np.float64).ravel() if k in delta
                           else np.zeros(int(np.prod(shapes[k]))) for k in names])
    return encode_fixed(np.append(flat * weight, weight), frac_bits)


def _index(roster) -> dict:
    """Shamir x-coordinate of each device: its 1-based rank in sorted order."""
    return {d: i + 1 for i, d in enumerate(sorted(roster))}


# --- the client -----------------------------------------------------------------------------------

class SecAggClient:
    """One device's state for one round (keys, seeds, received shares); discard it after the round."""

    def __init__(self, device_id: str, round_id: int):
        _, ser, Priv, *_ = _crypto()
        self.me, self.round_id = device_id, int(round_id)
        raw = ser.Encoding.Raw
        self._c = Priv.generate()
        self._s = Priv.generate()
        self.c_pk = self._c.public_key().public_bytes(raw, ser.PublicFormat.Raw)
        self.s_pk = self._s.public_key().public_bytes(raw, ser.PublicFormat.Raw)
        self._c_sk = self._c.private_bytes(raw, ser.PrivateFormat.Raw, ser.NoEncryption())
        self._s_sk = self._s.private_bytes(raw, ser.PrivateFormat.Raw, ser.NoEncryption())
        self._b = secrets.token_bytes(32)
        self.roster = self.u2 = None
        self.held: dict = {}  # from device -> (share of its s_sk, share of its b)

    def advertise(self) -> dict:
        return {"c_pk": self.c_pk.hex(), "s_pk": self.s_pk.hex()}

    def _aad(self, frm, to) -> bytes:
        return f"edgelearn-secagg|{self.round_id}|{frm}|{to}".encode()

    def share_keys(self, roster: dict, threshold: int) -> dict:
        """{device: hex ciphertext of (share of my masking key, share of my self seed)}."""
        *_x, AESGCM, _h = _crypto()
        if roster.get(self.me) != self.advertise():
            raise SecAggError(f"the roster does not hold {self.me}'s advertised keys",
                              fix="advertise again; the server may have restarted the round")
        if not len(roster) // 2 < threshold <= len(roster):
            raise SecAggError(f"threshold {threshold} for {len(roster)} devices: it must exceed half of them, "
                              "or a server could learn both kinds of share of one device",
                              fix="raise the threshold")
        self.roster, self.t = {d: (bytes.fromhex(k["c_pk"]), bytes.fromhex(k["s_pk"])) for d, k in roster.items()}, threshold
        idx = _index(self.roster)
        sk_shares = shamir_split(self._s_sk, len(idx), threshold)
        b_shares = shamir_split(self._b, len(idx), threshold)
        out = {}
        for v, i in idx.items():
            plain = sk_shares[i - 1].to_bytes(66, "big") + b_shares[i - 1].to_bytes(66, "big")
            if v == self.me:
                self.held[v] = (sk_shares[i - 1], b_shares[i - 1])
                continue
            key = agree(self._c_sk, self.roster[v][0], b"edgelearn-secagg-enc")
            nonce = secrets.token_bytes(12)
            out[v] = (nonce + AESGCM(key).encrypt(nonce, plain, self._aad(self.me, v))).hex()
        return out

    def masked_input(self, inbox: dict, x: np.ndarray) -> np.ndarray:
        """``x`` (uint32, fixed point) masked; ``inbox`` = {device: ciphertext it sent me}."""
        *_x, AESGCM, _h = _crypto()
        if self.roster is None:
            raise SecAggError("masked_input before share_keys", fix="follow the protocol order")
        for u, ct in inbox.items():
            if u not in self.roster or u == self.me:
                raise SecAggError(f"share from {u!r}, who is not in this round's roster", fix="restart the round")
            raw = bytes.fromhex(ct)
            key = agree(self._c_sk, self.roster[u][0], b"edgelearn-secagg-enc")
            try:
                plain = AESGCM(key).decrypt(raw[:12], raw[12:], self._aad(u, self.me))
            except Exception:
                raise SecAggError(f"the share from {u!r} does not decrypt (tampered or misrouted)",
                                  fix="drop this round") from None
            self.held[u] = (int.from_bytes(plain[:66], "big"), int.from_bytes(plain[66:], "big"))
        self.u2 = set(inbox) | {self.me}
        if len(self.u2) < self.t:
            raise SecAggError(f"only {len(self.u2)} devices shared keys; the threshold is {self.t}",
                              fix="the round cannot complete securely; wait for the next")
        y = np.asarray(x, np.uint32) + prg(self._b, len(x))
        for v in self.u2 - {self.me}:
            m = prg(agree(self._s_sk, self.roster[v][1], b"edgelearn-secagg-mask"), len(x))
            y = y + m if self.me < v else y - m  # uint32 wraps: arithmetic mod 2^32
        return y.astype(np.uint32)

    def unmask(self, survivors) -> dict:
        """{"b": {survivor: share}, "s_sk": {dropped: share}}, share = hex; never both for one device."""
        surv = set(survivors)
        if self.u2 is None or not surv <= self.u2 or self.me not in surv:
            raise SecAggError("the survivor list is not a subset of the devices that shared keys with me",
                              fix="the server is inconsistent; abort this round")
        if len(surv) < self.t:
            raise SecAggError(f"{len(surv)} survivors, below the threshold {self.t}", fix="abort this round")
        return {"b": {v: hex(self.held[v][1]) for v in surv},
                "s_sk": {v: hex(self.held[v][0]) for v in self.u2 - surv}}
