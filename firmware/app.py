"""The firmware application: audio in, keywords out, a custom keyword enrolled and adapted, updates sent.

``App`` owns everything that lasts: the int8 model (``edge.portable.model``),
the streaming MFCC (``edge.portable.mfcc``), the prototype head
(``edge.portable.proto``), the replay buffer (``edge.portable.replay``), the
schedule policy (``edge.portable.schedule``) and one update buffer allocated at
boot. ``handle(kind, seq, payload)`` answers one link frame (firmware/link.py,
commands in docs/firmware.md); the answer is always an ACK or a NAK with a
one-line reason, and a failed command changes no state. State files are
written atomically (``board.atomic_write``), so a reset at any point leaves the
last good state.

    from firmware.app import App
    from firmware.board import FakeBoard
    app = App(FakeBoard(root="board/"))
    replies = app.handle(1, 1, b"status")      # [(kind, payload), ...]
"""

import array
import gc
import hashlib
import json
import os
import struct

from edge.portable import chunks as CH
from edge.portable.mfcc import N_FRAMES, N_MFCC, FeatureRing, MfccStream
from edge.portable.model import McuModel, ModelBlobError
from edge.portable.proto import ProtoHead, find_outliers, loo_cosines, prototype
from edge.portable.replay import ReplayBuffer
from edge.portable.schedule import Readings, SchedulePolicy
from edge.portable.wire import FLAG_DELTA, FLAG_SUBSET, INT8, Header, encode_update_into
from firmware import link as L
from firmware.board import atomic_write, read_file

SHOTS = 5
MAX_KEYWORDS = 4
UPDATE_BYTES = 1024      # one bias-only update (<= MAX_KEYWORDS + 37 values) fits with room to spare
CHUNK_BYTES = 256
REPLAY_BYTES = 4096
BUNDLE_FILES = ("weights.elb", "graph.json")


class AppError(Exception):
    """A command that cannot run; ``problem`` and ``fix`` go back over the link in a NAK."""

    def __init__(self, problem, fix=""):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def sha256_file(path):
    h = hashlib.sha256()
    buf = bytearray(512)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(memoryview(buf)[:n])
    return h.digest()


def _hex(b):
    return "".join("%02x" % x for x in b)


def verify_bundle(board, d):
    """The bundle in directory ``d`` (``bundle.json`` + files): parsed description, digests checked."""
    raw = read_file(board.path(d + "/bundle.json"))
    if raw is None:
        raise AppError("no bundle in %s" % d, "deploy one: edgelearn flash --port PORT --bundle B")
    try:
        desc = json.loads(raw)
        files = desc["files"]
    except (ValueError, KeyError):
        raise AppError("%s/bundle.json is damaged" % d, "deploy the bundle again")
    for name in BUNDLE_FILES:
        want = files.get(name)
        try:
            got = _hex(sha256_file(board.path(d + "/" + name)))
        except OSError:
            raise AppError("bundle file %s is missing" % name, "deploy the bundle again")
        if got != want:
            raise AppError("bundle file %s does not match its digest (transfer cut short?)" % name,
                           "deploy the bundle again")
    return desc


class App:
    def __init__(self, board, policy=None):
        self.board = board
        board.ensure_dirs()
        self.link_buf = bytearray(L.HEADER_LEN + L.MAX_PAYLOAD + 4)
        self.update_buf = bytearray(UPDATE_BYTES)
        self.update_len = 0
        self.events = []
        self._install_pending()
        self._load_bundle("bundle")
        self.ring = FeatureRing()
        self.stream = MfccStream(self.ring)
        self.feats = array.array("f", bytes(4 * N_FRAMES * N_MFCC))
        self.emb = array.array("f", bytes(4 * self.dim))
        self.probs = array.array("f", bytes(4 * len(self.labels)))
        self.live = False
        self.since_detect = 0
        self.shots = []
        self.enrol_name = None
        self.policy = policy or SchedulePolicy()
        self._load_state()
        self.last_seq = -1
        self.last_reply = None
        self.now_s = 0

    # --- bundle and state ---------------------------------------------------
    def _install_pending(self):
        b = self.board
        if read_file(b.path("bundle.new/bundle.json")) is None:
            return
        try:
            desc = verify_bundle(b, "bundle.new")
            cur = read_file(b.path("bundle/bundle.json"))
            if cur is not None:
                old = json.loads(cur)
                if desc["model_id"] != old["model_id"]:
                    raise AppError("new bundle is model %s, this board runs %s" % (desc["model_id"], old["model_id"]),
                                   "flash a bundle of the same model, or erase the board's state first")
                if desc["version"] < old["version"]:
                    raise AppError("new bundle is version %d, older than the running %d" % (desc["version"], old["version"]),
                                   "flash a newer bundle")
            McuModel(b.path("bundle.new/weights.elb"), b.path("bundle.new/graph.json"))  # smoke check
        except (AppError, ModelBlobError, ValueError, KeyError) as e:
            self.events.append("bundle rejected: %s; kept the running one" % getattr(e, "problem", e))
            _rmtree(b.path("bundle.new"))
            return
        _rmtree(b.path("bundle.old"))
        if read_file(b.path("bundle/bundle.json")) is not None:
            os.rename(b.path("bundle"), b.path("bundle.old"))
        os.rename(b.path("bundle.new"), b.path("bundle"))
        self.events.append("bundle installed: %s v%d" % (desc["model_id"], desc["version"]))

    def _load_bundle(self, d):
        desc = verify_bundle(self.board, d)
        self.model = McuModel(self.board.path(d + "/weights.elb"), self.board.path(d + "/graph.json"))
        self.model_id = desc["model_id"]
        self.version = desc["version"]
        self.scale = array.array("f", desc["scale"])
        self.labels = desc["labels"]
        emb = self.model.embedding
        if emb is None:
            raise AppError("the model has no embedding output", "deploy a bundle built by host/mcu_model.py")
        self.dim = len(emb)

    def _load_state(self):
        b = self.board
        cfg = json.loads(read_file(b.path("config.json")) or b"{}")
        self.device_id = cfg.get("device_id", "esp32-unprovisioned")
        self.key = read_file(b.path("state/device.key"))
        self.names = cfg.get("keywords", [])
        raw = read_file(b.path("state/head.bin"))
        self.head = ProtoHead(self.dim, MAX_KEYWORDS)
        if raw is not None:
            try:
                h = ProtoHead.from_bytes(raw, MAX_KEYWORDS)
                if h.dim == self.dim:
                    self.head = h
            except ValueError:
                self.events.append("state/head.bin unreadable; starting without custom keywords")
        raw = read_file(b.path("state/replay.bin"))
        replay = None
        if raw is not None:
            try:
                replay = ReplayBuffer.from_bytes(raw)
            except ValueError:
                self.events.append("state/replay.bin unreadable; starting an empty buffer")
        if replay is None or replay.dim != self.dim:
            replay = ReplayBuffer(self.dim, REPLAY_BYTES)
        self.replay = replay
        raw = read_file(b.path("state/sched.bin"))
        if raw is not None:
            try:
                self.policy.load_state(raw)
            except ValueError:
                pass

    def _save(self, name, data):
        try:
            atomic_write(self.board.path("state/" + name), data)
        except OSError as e:
            raise AppError("could not save %s (%s)" % (name, e.args[-1] if e.args else e),
                           "free space on the board (delete old bundles) and retry")

    def _save_keywords(self, head, names):
        cfg = json.loads(read_file(self.board.path("config.json")) or b"{}")
        cfg["keywords"] = names
        self._save("head.bin", head.to_bytes())
        try:
            atomic_write(self.board.path("config.json"), json.dumps(cfg).encode())
        except OSError:
            raise AppError("could not save config.json (filesystem full?)", "free space on the board and retry")

    # --- audio and inference -------------------------------------------------
    def push_audio(self, pcm):
        """int16 samples (array('h') or memoryview); runs detection every 0.5 s in live mode."""
        new = self.stream.push(pcm)
        if self.live and new:
            self.since_detect += new
            if self.ring.full() and self.since_detect >= N_FRAMES // 2:
                self.since_detect = 0
                k, p, w, pw = self.infer()
                if k >= 0:
                    self.events.append("keyword %s p=%.3f" % (self.names[k], p))
                elif w is not None:
                    self.events.append("word %s p=%.3f" % (w, pw))
        return new

    def infer(self):
        """Run the model on the current window: (keyword index or -1, p, built-in word or None, p_word)."""
        if not self.ring.full():
            raise AppError("only %d of %d frames of audio so far" % (self.ring.count, N_FRAMES),
                           "send at least 1 s of audio first")
        self.ring.normalized_into(self.scale, self.feats)
        self.model.set_input(self.feats)
        self.model.invoke()
        self.model.embedding_f(self.emb)
        self.model.probs(self.probs)
        k, p = self.head.best(self.emb) if self.head.count else (-1, 0.0)
        best = 0
        for i in range(len(self.probs)):
            if self.probs[i] > self.probs[best]:
                best = i
        word = self.labels[best]
        if word.startswith("_") or self.probs[best] < 0.6:
            return k, p, None, self.probs[best]
        return k, p, word, self.probs[best]

    # --- commands -------------------------------------------------------------
    def readings(self):
        b = self.board
        return Readings(battery_pct=b.battery_pct(), charging=b.charging(), has_battery=True,
                        temp_c=b.temp_c(), idle_s=3600, now_s=self.now_s)

    def cmd_status(self, args):
        gc.collect()
        free = gc.mem_free() if hasattr(gc, "mem_free") else -1  # -1: CPython has no fixed heap
        return "ok model=%s v=%d keywords=%d replay=%d heap_free=%d" % (
            self.model_id, self.version, self.head.count, self.replay.count, free)

    def cmd_clip(self, args):
        self.ring.reset()
        self.stream.reset()
        return "ok"

    def cmd_live(self, args):
        self.live = args[:1] == ["on"]
        self.since_detect = 0
        return "ok live=%d" % self.live

    def cmd_enrol(self, args):
        if not args:
            raise AppError("enrol needs a keyword name", "send: enrol NAME")
        if self.head.count >= MAX_KEYWORDS and args[0] not in self.names:
            raise AppError("%d custom keywords already" % MAX_KEYWORDS, "forget one first")
        self.enrol_name = args[0]
        self.shots = []
        return "ok enrolling %s" % args[0]

    def cmd_shot(self, args):
        if self.enrol_name is None:
            raise AppError("no enrolment in progress", "send: enrol NAME")
        self.infer()
        self.shots.append(array.array("f", self.emb))
        return "ok shot %d/%d" % (len(self.shots), SHOTS)

    def cmd_enrolled(self, args):
        if self.enrol_name is None or len(self.shots) < SHOTS:
            raise AppError("need %d shots, have %d" % (SHOTS, len(self.shots)), "record more shots")
        bad = find_outliers(self.shots)
        good = [e for i, e in enumerate(self.shots) if i not in bad]
        if len(good) < 3:
            raise AppError("the shots disagree (%d outliers)" % len(bad), "record the keyword again, clearly")
        cos = loo_cosines(good)
        lo = 1.0
        for i in range(len(cos)):
            c = float(cos[i])
            lo = c if c < lo else lo
        thr = max(0.5, min(0.95, lo - 0.05))
        head = ProtoHead.from_bytes(self.head.to_bytes(), MAX_KEYWORDS)
        names = list(self.names)
        k = head.add(prototype(good), thr)
        names.append(self.enrol_name)
        self._save_keywords(head, names)   # raises before anything in RAM changes
        self.head, self.names = head, names
        for e in good:
            self.replay.add(e, k)
        self.enrol_name, self.shots = None, []
        return "ok keyword %s id=%d threshold=%.4f outliers=%d" % (names[k], k, thr, len(bad))

    def cmd_detect(self, args):
        k, p, w, pw = self.infer()
        cos = self.head.cosines(self.emb) if self.head.count else []
        return "ok kw=%s p=%.4f word=%s pw=%.4f cos=%s emb=%s" % (
            self.names[k] if k >= 0 else "-", p, w or "-", pw,
            ",".join("%.5f" % c for c in cos), ",".join("%.5f" % v for v in self.emb))

    def cmd_feedback(self, args):
        label = int(args[0]) if args else -2
        if label < -1 or label >= self.head.count:
            raise AppError("feedback label must be -1 (not a keyword) or 0..%d" % (self.head.count - 1))
        d = self.policy.decide(self.readings())
        if d.action != "train":
            return "ok skipped (%s)" % d.reason
        head = ProtoHead.from_bytes(self.head.to_bytes(), MAX_KEYWORDS)
        loss = head.adapt_bias(self.emb, label)
        self._save("head.bin", head.to_bytes())
        self.head = head
        self.replay.add(self.emb, label if label >= 0 else 0xFFFE)
        self.policy.spend(1, self.now_s)
        try:  # the replay buffer and the day's energy spend are best-effort: the head is saved already
            self._save("replay.bin", (self.replay.header(), self.replay.body))
            self._save("sched.bin", self.policy.state_bytes())
            self.replay.mark_saved()
        except AppError as e:
            self.events.append("replay not saved: %s" % e.problem)
        return "ok adapted loss=%.4f" % loss

    def cmd_update(self, args):
        if self.key is None:
            raise AppError("no device key provisioned", "edgelearn flash --port PORT --device-key KEY")
        try:
            round_id, seq = int(args[0]), int(args[1])
        except (IndexError, ValueError):
            raise AppError("update needs ROUND SEQ", "send: update 3 17")
        hdr = Header(self.device_id, round_id, self.version, seq, num_examples=self.replay.count,
                     flags=FLAG_SUBSET | FLAG_DELTA)
        tensors = [("proto/bias", (MAX_KEYWORDS,), self.head.bias)]
        self.update_len = encode_update_into(self.update_buf, hdr, tensors, self.key, codec=INT8)
        return "ok update %d bytes" % self.update_len

    def update_chunks(self):
        """The last update as ELCK chunks (resends are byte-identical, so the gateway merges them)."""
        frame = memoryview(self.update_buf)[:self.update_len]
        return CH.iter_chunks(frame, CHUNK_BYTES)

    COMMANDS = ("status", "clip", "live", "enrol", "shot", "enrolled", "detect", "feedback", "update")

    def handle(self, kind, seq, payload):
        """One link frame in; a list of (kind, payload) frames to send back."""
        if seq == self.last_seq and self.last_reply is not None:
            return self.last_reply  # a resend: answer again, apply nothing twice
        out = []
        try:
            if kind == L.AUDIO:
                if len(payload) % 2:
                    raise AppError("audio payload has an odd byte count", "send whole int16 samples")
                n = self.push_audio(memoryview(array.array("h", payload)))
                reply = "ok frames=%d" % n
            elif kind == L.CMD:
                words = bytes(payload).decode().split()
                name = words[0] if words else ""
                if name not in self.COMMANDS:
                    raise AppError("unknown command %r" % name, "commands: " + " ".join(self.COMMANDS))
                reply = getattr(self, "cmd_" + name)(words[1:])
                if name == "update" or (name == "status" and False):
                    for c in self.update_chunks():
                        out.append((L.UPDATE, c))
            else:
                raise AppError("frame type %d is not for the board" % kind)
            out.insert(0, (L.ACK, struct.pack("<H", seq) + reply.encode()))
        except AppError as e:
            out = [(L.NAK, struct.pack("<H", seq) + ("%s; %s" % (e.problem, e.fix)).encode())]
        except (ValueError, OSError, MemoryError) as e:
            out = [(L.NAK, struct.pack("<H", seq) + ("%s: %s" % (type(e).__name__, e)).encode())]
        while self.events:
            out.append((L.EVENT, self.events.pop(0).encode()))
        self.last_seq, self.last_reply = seq, out
        return out


def _rmtree(path):
    try:
        names = os.listdir(path)
    except OSError:
        return
    for n in names:
        try:
            os.remove(path + "/" + n)
        except OSError:
            _rmtree(path + "/" + n)
    try:
        os.rmdir(path)
    except OSError:
        pass
