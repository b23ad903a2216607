"""``edgelearn aggregator``: create, provision, serve and inspect a federated aggregator.

    $ edgelearn aggregator init --state agg/ --clients-per-round 10 --heldout-corpus --rehearsal-corpus 24
    $ edgelearn aggregator provision --state agg/ --device pi-001 --out keys/
    $ edgelearn aggregator serve --state agg/ --port 8470
    $ edgelearn aggregator status --state agg/
    $ edgelearn aggregator revoke --state agg/ pi-001      # a stolen Pi: its key refused from now on

Replicas on PostgreSQL (any number of machines, one database; each replica its own --state):

    $ edgelearn aggregator init --state agg/ --db postgresql://edgelearn@db:5432/agg
    $ edgelearn aggregator serve --state agg-b/ --db postgresql://edgelearn@db:5432/agg --signing-key agg.key
"""

from __future__ import annotations

import json
import sys

from host.aggregator.config import CODECS, AggregatorConfig
from host.config_args import add_config_arguments, options_config
from host.fl.strategies import STRATEGIES
from host.netutil import bind, port_number

# the AggregatorConfig fields `aggregator init` offers as options (the rest keep their defaults)
INIT_FIELDS = ("mode", "strategy", "clients_per_round", "overselect", "max_overselect", "round_timeout",
               "buffer_size", "codec", "dp_clip", "dp_noise", "dp_reproducible", "secure_aggregation",
               "checkin_max_skew", "eval_tolerance", "eval_metric", "eval_against", "eval_shrink")
CHOICES = {"mode": ("sync", "async"), "strategy": tuple(STRATEGIES), "codec": CODECS,
           "eval_metric": ("accuracy", "balanced"), "eval_against": ("current", "start")}


DB_HELP = ("where the state lives: sqlite:///PATH (default: STATE/state.sqlite) or postgresql://user@host:port/db, "
           "one database for any number of `serve` replicas (a password goes in ~/.pgpass or PGPASSWORD)")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    i = sub.add_parser("init", help="create a state directory with model version base+1")
    i.add_argument("--state", required=True)
    i.add_argument("--db", help=DB_HELP)
    i.add_argument("--bundle", help="base bundle: a directory, .zip or a shipped bundle's name "
                                    "(default: the shipped kws-dscnn-s)")
    i.add_argument("--signing-key", help="Ed25519 .key for new versions (default: a new one in STATE/keys)")
    i.add_argument("--heldout", help="npz with X (N, D) embeddings and y labels for the publication check")
    i.add_argument("--heldout-corpus", action="store_true",
                   help="use embeddings of the corpus test voices as the held-out set")
    i.add_argument("--rehearsal", metavar="FILE",
                   help="npz with X (N, D) embeddings and y labels of the voices the model was trained on: every "
                        "version ships them and devices train on them beside their own examples, so rounds do "
                        "not forget those voices")
    i.add_argument("--rehearsal-corpus", type=int, default=0, metavar="K",
                   help="use K clips of each command from the corpus's training voices as the rehearsal set "
                        "(24: what bench fl_voices runs)")
    i.add_argument("--operating-negatives", type=int, default=0, metavar="N",
                   help="render N word pairs by the corpus's training voices (900: ~24 min of speech, about a "
                        "minute) as keyword-free speech: every later version is published with per-word "
                        "thresholds that fire on it no more often than this first version at 0.7 (needs "
                        "--heldout or --heldout-corpus)")
    add_config_arguments(i, AggregatorConfig, INIT_FIELDS, choices=CHOICES, help={
        "overselect": "select at least this many times the quorum",
        "max_overselect": "... and at most this many, as observed drop-outs and latency demand",
        "secure_aggregation": "pairwise-masked sums only (Linux clients; sync mode; not with trimmed_mean/median)",
        "checkin_max_skew": "refuse check-ins dated further than this many seconds from the aggregator clock",
        "dp_reproducible": "draw DP noise from the config's public seed (reproducible experiments ONLY: whoever "
                           "knows the config can subtract it); default: a secret the database keeps",
        "eval_tolerance": "publish an aggregate only if its held-out score is at most this much below the "
                          "reference's",
        "eval_metric": "balanced: the mean of each class's recall (a held-out set that is mostly `_unknown_` "
                       "hides a lost command from plain accuracy); --heldout-corpus scores the 12-class task",
        "eval_against": "start: against the first published version, so losses under the tolerance cannot "
                        "add up over rounds; current: against the version the round started from",
        "eval_shrink": "fractions (e.g. 0.5 0.25): an aggregate that fails the check is published moved only "
                       "the first of these parts of the way from the current version that passes"})
    v = sub.add_parser("provision", help="register a device and write its HMAC key file (a revoked device: "
                                         "re-enabled with a new key)")
    v.add_argument("--state", required=True)
    v.add_argument("--db", help=DB_HELP)
    v.add_argument("--device", required=True)
    v.add_argument("--tier", default="linux", choices=["linux", "mcu"])
    v.add_argument("--out", required=True, help="directory for DEVICE.hmac (give it to the device only)")
    s = sub.add_parser("serve", help="run the HTTP service (one process per state directory: it holds "
                                     "STATE/aggregator.lock; replicas of one --db postgresql:// each have their own)")
    s.add_argument("--state", required=True)
    s.add_argument("--db", help=DB_HELP)
    s.add_argument("--signing-key", help="Ed25519 .key new versions are signed with (default: the one init recorded)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port_number, default=8470, help="TCP port, 1-65535 (default 8470; 0: any free port)")
    s.add_argument("--log-level", default="warning")
    t = sub.add_parser("status", help="print rounds, versions and revoked devices as JSON (reads only; works "
                                      "while serving)")
    t.add_argument("--state", required=True)
    t.add_argument("--db", help=DB_HELP)
    r = sub.add_parser("revoke", help="revoke a device's key: every request signed with it is refused (403) from "
                                      "now on, by a running serve too; its update in the open round is taken back; "
                                      "`provision` re-enables it with a new key")
    r.add_argument("--state", required=True)
    r.add_argument("--db", help=DB_HELP)
    r.add_argument("device_id", metavar="DEVICE_ID", help="the --device it was provisioned as")


def run(args) -> int:
    return ACTIONS[args.action](args)


def init(args) -> int:
    from host.aggregator.setup import init_state
    from host.bundle import bundle_arg

    from edge.errors import EdgelearnError

    if args.bundle is not None:  # a shipped bundle's name (kws-dscnn-s) works as in spot and serve
        args.bundle = str(bundle_arg(args.bundle))

    cfg = options_config(AggregatorConfig, args, INIT_FIELDS)  # bad options refused before any work
    if args.rehearsal_corpus < 0:
        raise EdgelearnError(f"--rehearsal-corpus {args.rehearsal_corpus} is negative",
                             fix="give a number of clips per command, e.g. 24")
    if args.operating_negatives and (args.operating_negatives < 0 or not (args.heldout or args.heldout_corpus)):
        raise EdgelearnError("--operating-negatives needs a held-out set and a positive count",
                             fix="add --heldout FILE or --heldout-corpus, and give N > 0 (900 is ~24 min)")
    heldout, rehearsal = _heldout(args), _rehearsal(args)  # both read (and a bad one refused) before rendering
    negatives = None
    if args.operating_negatives:
        if heldout is None or args.operating_negatives < 0:
            raise EdgelearnError("--operating-negatives needs a held-out set and a positive count",
                                 fix="add --heldout FILE or --heldout-corpus, and give N > 0 (900 is ~24 min)")
        from edge.bundle import load_bundle
        from edge.detect import default_keywords
        from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
        from host.data.negatives import stream_negatives, word_pairs

        bundle = load_bundle(args.bundle or DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
        km = KeywordModel(bundle)
        negatives = stream_negatives(km, word_pairs(args.operating_negatives, seed=41), default_keywords(km))
    v = init_state(args.state, cfg, bundle=args.bundle, signing_key=args.signing_key, heldout=heldout, db=args.db,
                   negatives=negatives, rehearsal=rehearsal)
    print(f"aggregator state in {args.state}: model version {v} published")
    return 0


def _xy_npz(path, option: str):
    """``X``, ``y`` and (if present) ``classes`` of an option's .npz file, or one EdgelearnError."""
    import zipfile

    import numpy as np

    from edge.errors import EdgelearnError

    try:
        with np.load(path) as z:
            return z["X"], z["y"], (z["classes"] if "classes" in z.files else None)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise EdgelearnError(f"{option} {path} does not exist", fix="pass an .npz file with arrays X and y")
        raise EdgelearnError(f"{option} {path} is not an .npz file with arrays X and y ({e})",
                             fix="write one with numpy.savez(path, X=embeddings, y=labels)")


def _rehearsal(args):
    """The rehearsal set every version ships: --rehearsal's npz, K corpus training clips per command, or None."""
    from edge.errors import EdgelearnError

    if args.rehearsal and args.rehearsal_corpus:
        raise EdgelearnError("--rehearsal and --rehearsal-corpus both name a rehearsal set", fix="give one of them")
    if args.rehearsal:
        return _xy_npz(args.rehearsal, "--rehearsal")[:2]
    if args.rehearsal_corpus < 0:
        raise EdgelearnError(f"--rehearsal-corpus {args.rehearsal_corpus} is negative",
                             fix="give a number of clips per command, e.g. 24")
    if args.rehearsal_corpus:
        from host.data.words import COMMANDS10, LABELS
        from host.fleet.data import load_embeddings, rehearsal_rows

        data = load_embeddings(args.bundle)
        rows = rehearsal_rows(data, [LABELS.index(w) for w in COMMANDS10], args.rehearsal_corpus)
        return data.X[rows], data.y[rows]
    return None


def _heldout(args):
    """The publication check's held-out set: --heldout's npz, the corpus test voices, or None."""
    if args.heldout:  # classes (optional): label id -> the class it is reported as
        return _xy_npz(args.heldout, "--heldout")
    if args.heldout_corpus:
        import numpy as np

        from host.data.words import LABELS
        from host.evaluate import to12
        from host.fleet.data import load_embeddings

        data = load_embeddings(args.bundle)
        r = data.rows("test")
        return data.X[r], data.y[r], to12(np.arange(len(LABELS)))  # the corpus's labels, scored as 12 classes
    return None


def provision(args) -> int:
    from host.aggregator.setup import provision as register, write_device_key

    path = write_device_key(args.out, args.device, register(args.state, args.device, tier=args.tier, db=args.db))
    print(f"provisioned {args.device}; key in {path}")
    return 0


def serve(args) -> int:
    import uvicorn

    from host.aggregator.app import build_app

    sock = bind(args.host, args.port)  # a bad host or a busy port: one sentence, before the state is locked
    try:
        app = build_app(args.state, signing_key=args.signing_key, db=args.db)
        config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="on")
        where = app.state.aggregator.store.url or args.state  # the URL with its password redacted
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"aggregator: serving {where} on http://{host}:{sock.getsockname()[1]}", flush=True)  # listening now
        cfg = app.state.aggregator.cfg
        if cfg.dp_reproducible and cfg.dp_noise > 0:
            print("aggregator: warning: dp_reproducible is set, so the DP noise follows the config's public seed "
                  "and protects nothing; for experiments only", file=sys.stderr, flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def revoke(args) -> int:
    from host.aggregator.errors import revoked_on
    from host.aggregator.setup import revoke as revoke_device

    r = revoke_device(args.state, args.device_id, db=args.db)
    when = revoked_on(r["revoked"])
    if r["already"]:
        print(f"{args.device_id} was already revoked on {when}; nothing changed")
        return 0
    taken = "".join(f"; its update in open round {rid} was taken back" for rid in r["dropped"])
    print(f"revoked {args.device_id} on {when}: every request signed with its key is refused from now on{taken} "
          f"(`edgelearn aggregator provision --device {args.device_id}` re-enables it with a new key)")
    return 0


def status(args) -> int:
    from host.aggregator.app import read_status

    print(json.dumps(read_status(args.state, db=args.db), indent=1))  # reads only: works beside a running `serve`
    return 0


ACTIONS = {"init": init, "provision": provision, "serve": serve, "status": status, "revoke": revoke}
