"""Boot phase of the firmware: verify and install a pending bundle, load the running one and the head.

Imported by ``App.__init__`` and unloaded right after (firmware/app.py
``unload``): digest checks and the install logic run once per boot and
need not occupy the heap while the board listens.

A ``bundle.new/`` is installed only if its digests match, its model id equals
the running one (prototypes live in that model's embedding space), its
version is not older and the model loads (smoke check); otherwise it is
deleted, an event says why, and the running bundle stays.

    from firmware import install
    install.install_pending(app); install.load_bundle(app, "bundle")
"""

import array
import hashlib
import json
import os

from edge.portable.model import McuModel, ModelBlobError
from edge.portable.proto import ProtoHead
from firmware.app import AppError
from firmware.board import read_file

BUNDLE_FILES = ("weights.elb", "graph.json")


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
            got = "".join("%02x" % x for x in sha256_file(board.path(d + "/" + name)))
        except OSError:
            raise AppError("bundle file %s is missing" % name, "deploy the bundle again")
        if got != want:
            raise AppError("bundle file %s does not match its digest (transfer cut short?)" % name,
                           "deploy the bundle again")
    return desc


def install_pending(app):
    b = app.board
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
        app.events.append("bundle rejected: %s; kept the running one" % getattr(e, "problem", e))
        rmtree(b.path("bundle.new"))
        return
    rmtree(b.path("bundle.old"))
    if read_file(b.path("bundle/bundle.json")) is not None:
        os.rename(b.path("bundle"), b.path("bundle.old"))
    os.rename(b.path("bundle.new"), b.path("bundle"))
    app.events.append("bundle installed: %s v%d" % (desc["model_id"], desc["version"]))


def load_bundle(app, d):
    """Check the digests of the files ``app.model`` was just read from; describe the bundle on ``app``."""
    try:
        desc = verify_bundle(app.board, d)
    except AppError:
        app.model = None   # read from files that do not match their digests: never run it
        raise
    app.model_id = desc["model_id"]
    app.version = desc["version"]
    app.scale = array.array("f", desc["scale"])
    app.labels = desc["labels"]
    app.dim = len(app.model.embedding)


def load_head(app, max_keywords):
    raw = read_file(app.board.path("state/head.bin"))
    if raw is not None:
        try:
            h = ProtoHead.from_bytes(raw, max_keywords)
            if h.dim == app.dim:
                return h
        except ValueError:
            app.events.append("state/head.bin unreadable; starting without custom keywords")
    return ProtoHead(app.dim, max_keywords)


def rmtree(path):
    try:
        names = os.listdir(path)
    except OSError:
        return
    for n in names:
        try:
            os.remove(path + "/" + n)
        except OSError:
            rmtree(path + "/" + n)
    try:
        os.rmdir(path)
    except OSError:
        pass
