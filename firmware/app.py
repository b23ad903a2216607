"""The firmware application: audio in, keywords out, a custom keyword enrolled and adapted, updates sent.

``App`` keeps resident only what live detection needs: the int8 model
(``edge.portable.model``), the streaming MFCC (``edge.portable.mfcc``) and
the prototype head (``edge.portable.proto``). Everything rarer is a *phase
module* imported when a command needs it and unloaded when the command is
answered (``phase``/``unload``): bundle checks at boot (firmware/install.py),
enrolment, adaptation, replay and the schedule policy (firmware/learn.py),
update encoding (firmware/report.py), check-ins (firmware/checkin.py). On a
100 KB heap the code of all of them at once does not fit beside the model's
weights.

``handle(kind, seq, payload)`` answers one link frame (edge/portable/link.py,
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
import json
import struct
import sys

from edge.portable.compat import const, zeros
from edge.portable.mfcc import N_FRAMES, N_MFCC, FeatureRing, MfccStream
from edge.portable.model import McuModel, ModelBlobError
from edge.portable.proto import ProtoHead
from edge.portable import link as L
from firmware.board import atomic_write, read_file

MAX_KEYWORDS = const(4)
# collect after every 8 KB allocated, not only when the heap is full: then where garbage and
# long-lived objects land does not depend on the heap's size, and a heap that is big enough
# for a sequence is not too small once a few bytes more or less were allocated before it
# (without it, the least heap that works is not monotonic near 100 KB)
_GC_EVERY = const(8192)
REPLAY_BYTES = const(4096)   # the board's replay buffer, serialised (firmware/learn.py)
# modules that stay loaded; everything else a command imports is dropped after it
RESIDENT = ("edge", "edge.portable", "edge.portable.compat", "edge.portable.quant", "edge.portable.kernels",
            "edge.portable.mfcc", "edge.portable.model", "edge.portable.proto", "edge.portable.link", "firmware",
            "firmware.board", "firmware.app", "firmware.main", "__main__")


class AppError(Exception):
    """A command that cannot run; ``problem`` and ``fix`` go back over the link in a NAK."""

    def __init__(self, problem, fix=""):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def phase(name):
    """Import ``firmware.<name>`` for one command; ``unload()`` drops it again."""
    __import__("firmware." + name)
    return sys.modules["firmware." + name]


def unload():
    """Forget every module outside ``RESIDENT`` so the collector can take its code (a no-op on CPython)."""
    if sys.implementation.name != "micropython":
        return
    for n in list(sys.modules):
        if n in RESIDENT:
            continue
        del sys.modules[n]
        pkg, _, leaf = n.rpartition(".")
        p = sys.modules.get(pkg)
        if p is not None and leaf in p.__dict__:
            delattr(p, leaf)  # the parent package keeps an attribute per submodule
    gc.collect()


def _byte_view(arr, nbytes):
    """A writable bytes view of an array's memory (MicroPython's memoryview cannot cast)."""
    if sys.implementation.name == "micropython":
        import uctypes
        return uctypes.bytearray_at(uctypes.addressof(arr), nbytes)
    return memoryview(arr).cast("B")


class App:
    def __init__(self, board, policy=None):
        if hasattr(gc, "threshold"):
            gc.threshold(_GC_EVERY)
        self.board = board
        board.ensure_dirs()
        self.events = []
        self.policy = policy          # None: firmware/learn.py builds the default from state/sched.bin
        self.update_len = 0
        self.update_buf = None
        self.pending_update = None    # (round, seq) of an update the Wi-Fi path has yet to deliver
        if read_file(board.path("bundle.new/bundle.json")) is not None:
            phase("install").install_pending(self)
            unload()
        if read_file(board.path("bundle/bundle.json")) is None:
            raise AppError("no bundle in bundle", "deploy one: edgelearn flash --port PORT --bundle B")
        # long-lived buffers first, in one stretch of a still unbroken heap: the front end's,
        # then the model's (its loader allocates the weight arenas before it parses anything)
        gc.collect()
        self.ring = FeatureRing()
        self.stream = MfccStream(self.ring)
        self.feats = zeros("f", N_FRAMES * N_MFCC)
        self.pcm = zeros("h", L.MAX_PAYLOAD // 2)   # audio frames land here, not in new arrays
        self.pcm_bytes = _byte_view(self.pcm, L.MAX_PAYLOAD)
        # the learning phase's replay buffer lives on flash; this is where it is read to and
        # changed, allocated once: later a 4 KB block may be nowhere in a 100 KB heap
        self.replay_store = bytearray(REPLAY_BYTES)
        try:
            self.model = McuModel(board.path("bundle/weights.elb"), board.path("bundle/graph.json"))
        except OSError:
            raise AppError("a file of the running bundle is missing", "deploy the bundle again")
        except ModelBlobError as e:
            raise AppError(e.problem, e.fix)
        unload()
        self.emb = zeros("f", len(self.model.embedding))
        self.probs = zeros("f", len(self.model.logits))
        inst = phase("install")
        inst.load_bundle(self, "bundle")   # digests and description; a mismatch drops the model again
        cfg = json.loads(read_file(board.path("config.json")) or b"{}")
        self.device_id = cfg.get("device_id", "esp32-unprovisioned")
        self.names = cfg.get("keywords", [])
        self.key = read_file(board.path("state/device.key"))
        self.head = inst.load_head(self, MAX_KEYWORDS)
        del inst
        unload()
        self.replay_count = phase("learn").replay_count(self)
        unload()
        self.live = False
        self.since_detect = 0
        self.shots = []
        self.enrol_name = None
        self.last_seq = -1
        self.last_reply = None
        self.now_s = 0

    def save(self, name, data):
        try:
            atomic_write(self.board.path("state/" + name), data)
        except OSError as e:
            raise AppError("could not save %s (%s)" % (name, e.args[-1] if e.args else e),
                           "free space on the board (delete old bundles) and retry")

    def need_key(self):
        if self.key is None:
            raise AppError("no device key provisioned", "edgelearn flash --port PORT --device-key KEY")

    # --- audio and inference -------------------------------------------------
    def push_audio(self, pcm, n=None):
        """The first ``n`` (default all) int16 samples of ``pcm``; runs detection every 0.5 s in live mode."""
        new = self.stream.push(pcm, 0, n)
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
        m = self.model
        m.set_input(self.feats)
        m.invoke()
        m.embedding_f(self.emb)
        m.probs(self.probs)
        k, p = self.head.best(self.emb) if self.head.count else (-1, 0.0)
        pr = self.probs
        best = 0
        for i in range(len(pr)):
            if pr[i] > pr[best]:
                best = i
        word = self.labels[best]
        if word.startswith("_") or pr[best] < 0.6:
            word = None
        return k, p, word, pr[best]

    # --- commands -------------------------------------------------------------
    def cmd_status(self, args):
        gc.collect()
        free = gc.mem_free() if hasattr(gc, "mem_free") else -1  # -1: CPython has no fixed heap
        return "ok model=%s v=%d keywords=%d replay=%d heap_free=%d" % (
            self.model_id, self.version, self.head.count, self.replay_count, free)

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
        return "ok shot %d/5" % len(self.shots)

    def cmd_detect(self, args):
        k, p, w, pw = self.infer()
        cos = self.head.cosines(self.emb) if self.head.count else []
        return "ok kw=%s p=%.4f word=%s pw=%.4f cos=%s emb=%s" % (
            self.names[k] if k >= 0 else "-", p, w or "-", pw,
            ",".join("%.5f" % c for c in cos), ",".join("%.5f" % v for v in self.emb))

    def cmd_enrolled(self, args):
        return phase("learn").enrolled(self, args)

    def cmd_feedback(self, args):
        return phase("learn").feedback(self, args)

    def cmd_update(self, args):
        return phase("report").update(self, args)

    def cmd_checkin(self, args):
        return phase("checkin").checkin(self, args)

    COMMANDS = ("status", "clip", "live", "enrol", "shot", "enrolled", "detect", "feedback", "update", "checkin")

    def handle(self, kind, seq, payload):
        """One link frame in; a list of (kind, payload) frames to send back."""
        if seq == self.last_seq and self.last_reply is not None:
            return self.last_reply  # a resend: answer again, apply nothing twice
        out = []
        try:
            if kind == L.AUDIO:
                if len(payload) % 2:
                    raise AppError("audio payload has an odd byte count", "send whole int16 samples")
                n = len(payload)
                self.pcm_bytes[0:n] = payload
                reply = "ok frames=%d" % self.push_audio(self.pcm, n // 2)
            elif kind == L.CMD:
                words = bytes(payload).decode().split()
                name = words[0] if words else ""
                if name not in self.COMMANDS:
                    raise AppError("unknown command %r" % name, "commands: " + " ".join(self.COMMANDS))
                reply = getattr(self, "cmd_" + name)(words[1:])
                if name == "update":
                    unload()   # the codec goes before the chunker comes: never both in the heap
                    out = phase("report").chunks(self)
            else:
                raise AppError("frame type %d is not for the board" % kind)
            out.insert(0, (L.ACK, struct.pack("<H", seq) + reply.encode()))
        except AppError as e:
            out = [(L.NAK, struct.pack("<H", seq) + ("%s; %s" % (e.problem, e.fix)).encode())]
        except (ValueError, OSError, MemoryError) as e:
            out = [(L.NAK, struct.pack("<H", seq) + ("%s: %s" % (type(e).__name__, e)).encode())]
        unload()
        while self.events:
            out.append((L.EVENT, self.events.pop(0).encode()))
        self.last_seq, self.last_reply = seq, out
        return out
