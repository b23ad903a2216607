"""The federated-learning client of a Linux device (Raspberry Pi): check in, train, upload, update.

One cycle: report the device's state to the aggregator (signed with the
device key), get a task or "come back in N s"; if the task names a newer
model, download its signed bundle and install it through ``edge.store`` (a
bad bundle changes nothing); train the trainable tail on the device's own
embeddings; encode the delta with the portable wire codec (INT8, TOPK_INT8
with error feedback, or dense), authenticated with the device key; upload it
whole or in resumable chunks, or, when the task asks for secure aggregation,
drive the secure round (``edge.secagg``). The bundle is verified once per
round (when the round's training loads it); encoding and the secure round use
that head. The sequence number is reserved on disk before a frame is built,
so a restart never reuses one; a state that went back (a restored backup, a
re-imaged card) is refused as a replay naming the aggregator's last seq, and
continues above it, re-sending that round's update once (``run_once``). HTTP is
``edge.fl.transport``; the model glue ``edge.fl.model``.

    client = FLClient("http://agg:8470", "pi-001", key, "/var/lib/edgelearn/fl",
                      trusted_keys="/etc/edgelearn/keys", data=(X, y))
    outcome = client.run_once({"battery": 0.9, "charging": True, "network": "wifi"})
"""

from __future__ import annotations

import array
import hashlib
import hmac
import json
import os
import re
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from edge.atomic import atomic_write, npz_bytes, set_aside
from edge.fl.model import FederatedHeadTrainer, head_logits, load_head, load_rehearsal
from edge.fl.transport import FLError, HttpTransport, call
from edge.portable import wire
from edge.portable.chunks import iter_chunks
from edge.portable.wire_topk import TopKEncoder
from edge.store import BundleStore

CODECS = {"dense_f32": wire.DENSE_F32, "int8": wire.INT8, "topk_int8": wire.TOPK_INT8}


class FLClient:
    """One device's federated client; state (seq, top-k residuals, bundles) lives in ``state_dir``."""

    def __init__(self, server, device_id: str, key: bytes, state_dir, trusted_keys=None, data=None,
                 trainer=None, tier: str = "linux", seed=None):
        self.http = server if hasattr(server, "request") else HttpTransport(server)
        self.device_id, self.key, self.tier = device_id, bytes(key), tier
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = BundleStore(self.dir / "store", trusted_keys)
        self.data = data
        self.trainer = trainer or FederatedHeadTrainer()
        self.rng = np.random.default_rng(seed)
        self.topk = TopKEncoder(fraction=0.05)
        self._load_state()
        self.bytes_up = 0
        self._head = None  # (model version, head): the bundle this round verified
        self._rehearsal = (None, None)  # (model version, (X, y) or None): that bundle's rehearsal set
        self.skip_versions: set = set()  # versions a wait answer names that are not installed (rejected)

    # state that must survive a power cut: the last seq used, and top-k residuals
    def _load_state(self):
        """Both files are written atomically, so damage comes from outside (a bad card, a hand
        edit). A damaged file is kept beside as ``NAME.damaged``, with one warning, and the client
        goes on: the sequence resumes at the Unix time in seconds, above any number a device
        counting from 0 reaches (a frame a second for 56 years), so the aggregator's replay check
        still holds and nothing is sent under a used number; lost top-k residuals only cost the
        error feedback of the next round."""
        p = self.dir / "fl_state.json"
        self.seq = 0
        if p.exists():
            try:
                seq = json.loads(p.read_bytes())["seq"]
                if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2 ** 32:
                    raise ValueError(f"seq is {seq!r}")
                self.seq = seq
            except (ValueError, KeyError, TypeError) as e:
                self.seq = int(time.time())
                self._set_aside(p, f"{e}; the sequence resumes at {self.seq}")
        r = self.dir / "topk_residuals.npz"
        if r.exists():
            try:
                with np.load(r) as z:
                    self.topk.residuals = {k: array.array("f", z[k].astype(np.float32).tobytes()) for k in z.files}
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                self.topk.residuals = {}
                self._set_aside(r, f"{e}; the next top-k update starts without error feedback")

    _set_aside = staticmethod(set_aside)

    def _next_seq(self) -> int:
        self.seq += 1
        atomic_write(self.dir / "fl_state.json", json.dumps({"seq": self.seq}).encode())
        return self.seq

    # the aggregator's ReplayError for a frame carries its last accepted seq as the body's
    # ``last_seq`` field (host/aggregator/uploads.py ``_fresh``); an aggregator from before that field
    # only names it in the problem text (edge.portable.wire_decode check_fresh words it), read as a
    # fallback. A check-in's ReplayError is about its clock time: no field, and the text does not match
    _LAST_SEQ = re.compile(r"not newer than the last accepted seq (\d+)")

    def _seq_behind(self, e: FLError):
        """The aggregator's last accepted seq when ``e`` refused a frame as not newer (this device's
        state went back: a restored backup, a re-imaged card with the same id and key), else None."""
        if e.status != 409 or e.reason != "ReplayError":
            return None
        last = getattr(e, "fields", {}).get("last_seq")
        if last is not None:
            ok = isinstance(last, int) and not isinstance(last, bool) and 0 <= last < 2 ** 32
            return last if ok else None  # a field that is not a seq is not guessed from the text
        m = self._LAST_SEQ.search(e.problem)
        return int(m.group(1)) if m else None

    def _jump_seq(self, last: int):
        """Continue above the aggregator's ``last`` accepted seq (never back: a seq is never reused),
        saved atomically so a power cut after the jump does not put the device behind again."""
        if last > self.seq:
            self.seq = last
            atomic_write(self.dir / "fl_state.json", json.dumps({"seq": self.seq}).encode())

    def _save_residuals(self):
        atomic_write(self.dir / "topk_residuals.npz",
                     npz_bytes({k: np.frombuffer(bytes(v), np.float32) for k, v in self.topk.residuals.items()}))

    def _call(self, method, path, body=b"", headers=None, ok=(200,)):
        return call(self.http, method, path, body, headers, ok)

    # --- the protocol -------------------------------------------------------
    def checkin(self, status: dict) -> dict:
        cur = self.store.pointer()["current"]
        # strictly increasing: the aggregator refuses a check-in not newer than the last (replays)
        self._checkin_t = max(time.time(), getattr(self, "_checkin_t", 0.0) + 1e-6)
        body = json.dumps({"device_id": self.device_id, "tier": self.tier, "time": self._checkin_t,
                           "model_version": self.current_version() if cur else None, **status}).encode()
        mac = hmac.new(self.key, body, hashlib.sha256).hexdigest()
        _, raw = self._call("POST", "/v1/checkin", body, {"Content-Type": "application/json",
                                                          "X-Edgelearn-Device": self.device_id,
                                                          "X-Edgelearn-Mac": mac})
        return json.loads(raw)

    def current_version(self):
        ptr = self.store.pointer()["current"]
        return None if ptr is None else int(ptr.rsplit("-v", 1)[1])

    def ensure_model(self, version: int) -> dict:
        """Install bundle ``version`` if it is not current (download, verify, smoke check, swap); its
        head. The bundle is verified here, once: by the install, else by loading the current one."""
        if self.current_version() != version:
            _, raw = self._call("GET", f"/v1/bundles/{version}.zip")
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".zip")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(raw)
                bundle = self.store.install(tmp, smoke_check=lambda b: self._smoke(b))
            finally:
                os.unlink(tmp)
        else:
            bundle = self.store.current()
        head = load_head(bundle)
        self._head = (version, head)
        self._rehearsal = (version, load_rehearsal(bundle, head))
        return head

    def install_newer(self, version) -> bool:
        """Install published ``version`` (a wait answer's ``model_version``) when it is newer than the
        store's current one and not in ``skip_versions`` (versions the device rejected: a rolled-back
        version is not downloaded again at every check-in). Verified and smoke checked as any install."""
        if not isinstance(version, int) or isinstance(version, bool) or version in self.skip_versions:
            return False
        cur = self.current_version() if self.store.pointer()["current"] else None
        if cur is not None and version <= cur:
            return False
        self.ensure_model(version)
        return True

    def _round_head(self, version: int) -> dict:
        """The head this round's ``train`` verified; loaded (and verified) now if it has not."""
        if self._head is not None and self._head[0] == version and self.current_version() == version:
            return self._head[1]
        return self.ensure_model(version)

    @staticmethod
    def _smoke(bundle):
        head = load_head(bundle)
        z = head_logits(head, np.zeros((1, head["classifier.w"].shape[0]), np.float32))
        if z.shape != (1, len(bundle.labels)) or not np.all(np.isfinite(z)):
            raise ValueError(f"head gives logits of shape {z.shape}, expected (1, {len(bundle.labels)})")
        load_rehearsal(bundle, head)  # a version whose rehearsal set does not fit is not installed

    def train(self, task: dict) -> tuple[dict, int]:
        params = self.ensure_model(int(task["model_version"]))
        X, y = self.data() if callable(self.data) else self.data
        if len(y) == 0:
            raise FLError("the device has no examples to train on", fix="enrol some clips first")
        n = len(y)
        rehearsal = self._rehearsal[1] if self._rehearsal[0] == int(task["model_version"]) else None
        if rehearsal is not None and len(rehearsal[1]):
            # the version's rehearsal rows (the voices the model was trained on) train beside the
            # device's own, so a round cannot forget them; the update is weighted by the device's rows
            X = np.concatenate([np.asarray(X, np.float32), rehearsal[0]])
            y = np.concatenate([np.asarray(y, np.int64), rehearsal[1]])
        new = self.trainer.train(params, X, y, task, self.rng)
        delta = {k: (new[k] - params[k]).astype(np.float32) for k in new}  # only the trained tensors
        clip = float(task.get("clip_norm") or 0)
        if clip > 0:  # the server clips too; clipping here keeps the update under its norm check
            norm = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta.values())))
            if norm > clip:
                delta = {k: v * np.float32(clip / norm) for k, v in delta.items()}
        return delta, n

    def encode(self, task: dict, delta: dict, num_examples: int) -> bytes:
        codec = CODECS[task.get("codec", "int8")]
        if codec == wire.TOPK_INT8:
            self.topk.fraction = float(task.get("topk_fraction", 0.05))
        hdr = wire.Header(self.device_id, int(task["round_id"]), int(task["model_version"]),
                          self._next_seq(), num_examples)
        if set(delta) != set(self._round_head(int(task["model_version"]))):
            hdr.flags |= wire.FLAG_SUBSET  # bias-only / sparse: absent tensors are unchanged
        tensors = [(k, v.shape, array.array("f", v.astype(np.float32).tobytes())) for k, v in sorted(delta.items())]
        frame = wire.encode_update(hdr, tensors, self.key, codec=codec,
                                   topk=self.topk if codec == wire.TOPK_INT8 else None)
        if codec == wire.TOPK_INT8:
            self._save_residuals()
        return bytes(frame)

    def upload(self, frame: bytes, chunk_size: int = 0) -> dict:
        hdrs = {"Content-Type": "application/octet-stream", "X-Edgelearn-Device": self.device_id}
        if not chunk_size or len(frame) <= chunk_size:
            _, raw = self._call("POST", "/v1/updates", frame, hdrs)
            self.bytes_up += len(frame)
            return json.loads(raw)
        result = None
        for c in iter_chunks(frame, chunk_size):
            _, raw = self._call("POST", "/v1/chunks", c, hdrs, ok=(200, 202))
            self.bytes_up += len(c)
            result = json.loads(raw)
        return result

    # --- secure aggregation (edge/secagg.py; a task with "secagg" instead of a frame upload) ----------
    def _secagg(self, msg: dict) -> dict:
        body = json.dumps(msg).encode()
        _, raw = self._call("POST", "/v1/secagg", body, {
            "Content-Type": "application/json", "X-Edgelearn-Device": self.device_id,
            "X-Edgelearn-Mac": hmac.new(self.key, body, hashlib.sha256).hexdigest()})
        self.bytes_up += len(body)
        return json.loads(raw)

    def secure_step(self, task: dict, delta: dict, num_examples: int) -> dict:
        """Send this device's next secure-aggregation message if the round's phase wants one, else poll.
        Returns the server's view ({"phase": ...}); call until the phase is "done" or "failed"."""
        import base64

        from edge.secagg import SecAggClient, client_vector
        rid, spec = int(task["round_id"]), task["secagg"]
        sa = getattr(self, "_sa", None)
        if sa is None or sa.round_id != rid:
            sa = self._sa = SecAggClient(self.device_id, rid)
            self._sa_sent = {"advertise"}
            return self._secagg({"round_id": rid, "step": "advertise", "keys": sa.advertise()})
        view = self._secagg({"round_id": rid, "step": "state"})
        phase = view["phase"]
        if phase in self._sa_sent or phase not in ("share", "masked", "unmask"):
            return view
        if phase == "share" and "roster" in view:
            msg = {"step": "share", "shares": sa.share_keys(view["roster"], int(view["threshold"]))}
        elif phase == "masked" and "inbox" in view:
            params = self._round_head(int(task["model_version"]))
            # under DP every user counts once (user-level clipping happened in train())
            w = 1.0 if task.get("clip_norm") else float(num_examples)
            x = client_vector(delta, w, spec["names"], {k: v.shape for k, v in params.items()}, int(spec["frac_bits"]))
            y = sa.masked_input(view["inbox"], x)
            msg = {"step": "masked", "y": base64.b64encode(y.astype("<u4").tobytes()).decode()}
        elif phase == "unmask" and "survivors" in view:
            msg = {"step": "unmask", "shares": sa.unmask(view["survivors"])}
        else:
            return view  # dropped from this phase by the server: nothing to send
        self._sa_sent.add(phase)
        return self._secagg({"round_id": rid, **msg})

    def run_secure(self, task: dict, delta: dict, num_examples: int, poll: float = 0.2,
                   timeout: float = 600.0) -> dict:
        """Drive a whole secure round (blocking, polling every ``poll`` s); the final view."""
        end = time.monotonic() + timeout
        view = self.secure_step(task, delta, num_examples)
        while view["phase"] not in ("done", "failed"):
            if time.monotonic() > end:
                raise FLError(f"secure round {task['round_id']} did not finish in {timeout:.0f} s",
                              fix="the aggregator fails the round at its deadline; check in again")
            time.sleep(poll)
            view = self.secure_step(task, delta, num_examples)
        return view

    def run_once(self, status: dict, drop_after_training: bool = False) -> dict:
        """One check-in; trains and uploads when given a task. Returns the server's last answer."""
        ans = self.checkin(status)
        if ans.get("action") == "update":
            self.ensure_model(int(ans["model_version"]))
            return ans
        if ans.get("action") == "wait":  # a newer version published: installed now, not at the next task
            self.install_newer(ans.get("model_version"))
            return ans
        if ans.get("action") != "train":
            return ans
        task = ans["task"]
        delta, n = self.train(task)
        if "secagg" in task:
            if drop_after_training:
                return {"action": "dropped", "round_id": task["round_id"]}
            return {"action": "secure", **self.run_secure(task, delta, n)}
        # the top-k error feedback before this round's encoding, so a re-send re-encodes the same update
        residuals = {k: array.array("f", v) for k, v in self.topk.residuals.items()}
        frame = self.encode(task, delta, n)
        if drop_after_training:
            return {"action": "dropped", "round_id": task["round_id"]}
        chunk = int(task.get("chunk_size", 0))
        try:
            return {"action": "uploaded", **self.upload(frame, chunk)}
        except FLError as e:
            last = self._seq_behind(e)
            if last is None or last >= 2 ** 32 - 1:
                raise
        # refused as a replay: the device's seq went back (restored state). The aggregator refuses a
        # not-newer seq before any write (host/aggregator/uploads.py _fresh), so the refused frame
        # counted nowhere; the same update under a seq above the named one is sent once, in this round.
        # It cannot count twice: the aggregator takes one update per device per round
        # (AlreadyContributed), and an identical resend of an accepted frame answers 200 duplicate, never 409.
        self._jump_seq(last)
        self.topk.residuals = residuals
        frame = self.encode(task, delta, n)
        return {"action": "uploaded", "seq_resumed": self.seq, **self.upload(frame, chunk)}
