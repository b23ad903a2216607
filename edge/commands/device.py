"""``edgelearn device``: detect, enroll, adapt and status on a Linux board.

    $ edgelearn device enroll --state st --keyword "hey edge" --wav a.wav b.wav c.wav d.wav e.wav
    $ edgelearn device detect --state st --wav long.wav --json
    {"keyword": "hey edge", "time_s": 3.42, "score": 0.97}
    $ edgelearn device adapt --state st --data mydata/ --strategy lora --context kitchen
    $ edgelearn device adapt --state st --data my_commands/ --recipe speaker --ambient tv.wav
    $ edgelearn device status --state st

Argument parsing and printing only: each action makes one call on ``edge.device.Device`` (the
same operations from Python) and prints what it returns.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.device import Device
from edge.options import MAX_STRIDE, arg_type


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    for name, hlp in (("detect", "stream audio and print detections"),
                      ("enroll", "learn a custom keyword from 3-10 clips"),
                      ("adapt", "adapt the tail on local labelled clips (scheduler-gated)"),
                      ("calibrate", "set base-keyword thresholds by false accepts per hour on audio "
                                    "that says none of them, and measure each enrolled keyword's levels"),
                      ("sensitivity", "show or set an enrolled keyword's sensitivity (low, medium, high)"),
                      ("status", "show the state directory"),
                      ("run", "the device agent: detect all day, adapt when the scheduler allows, "
                              "join a federation (edge/agent.py)")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped)")
        s.add_argument("--pubkey", type=Path, action="append", default=None,
                       help="trusted public key file or directory (repeatable; added to the shipped release keys)")
        s.add_argument("--backend", default="auto", help="litert | onnxruntime | auto")
        s.add_argument("--state", type=Path, required=True, help="device state directory")
        if name == "detect":
            src = s.add_mutually_exclusive_group(required=True)
            src.add_argument("--wav", type=Path, help="16 kHz mono 16-bit WAV of any length")
            src.add_argument("--mic", action="store_true", help="read the default ALSA device (arecord)")
            s.add_argument("--mic-device", default=None, metavar="ALSA_DEVICE",
                           help="with --mic: the capture device, e.g. hw:1,0 (`arecord -l` lists them; "
                                "default: ALSA's default)")
            s.add_argument("--json", action="store_true", help="one JSON object per detection")
            level = s.add_mutually_exclusive_group()
            level.add_argument("--threshold", type=arg_type("threshold"), default=None,
                               help="base keyword threshold (default: the version's own operating point, "
                                    "else 0.7)")
            level.add_argument("--sensitivity", type=arg_type("sensitivity"), default=None, metavar="FA_PER_HOUR",
                               help="per-keyword thresholds from `device calibrate` for at most this "
                                    "many false accepts per hour")
            s.add_argument("--keywords", default=None, help="comma-separated base keywords, or 'all'")
            s.add_argument("--stride", type=arg_type("stride"), default=4,
                           help=f"hops (20 ms) between encoder runs, 1..{MAX_STRIDE}")
            s.add_argument("--confirm", type=arg_type("confirm"), default=0.9,
                           help="base-keyword detections at or above this score feed the replay buffer")
            add_second_stage(s)
            s.add_argument("--no-replay", action="store_true", help="do not feed detections to the replay buffer")
        elif name == "calibrate":
            s.add_argument("--wav", type=Path, nargs="+", action="extend", required=True,
                           help="16 kHz WAVs of everyday audio that says none of the base keywords "
                                "(TV, conversation; an hour or more)")
            from edge.operating import TARGETS

            s.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS),
                           help="false accepts per hour to calibrate for, comma-separated")
        elif name == "enroll":
            s.add_argument("--keyword", required=True, help="the new word or short phrase")
            s.add_argument("--wav", type=Path, nargs="+", action="extend", required=True,
                           help="3-10 clips of it (--wav a.wav b.wav, or --wav once per clip)")
            again = s.add_mutually_exclusive_group()
            again.add_argument("--replace", action="store_true", help="re-enrol an existing keyword")
            again.add_argument("--add", action="store_true",
                               help="these clips are another person saying an enrolled keyword (up to 4 people): "
                                    "it is enrolled again from everyone's clips the device kept and these")
            s.add_argument("--sensitivity", default=None, choices=("low", "medium", "high"),
                           help="low: fewest false accepts, high: fewest misses (default medium, or with --add "
                                "the keyword's own; every level is calibrated at enrolment, `device "
                                "sensitivity` switches later)")
        elif name == "sensitivity":
            s.add_argument("--keyword", required=True, help="an enrolled keyword")
            pick = s.add_mutually_exclusive_group()
            pick.add_argument("--level", default=None, choices=("low", "medium", "high"),
                              help="detect it at this level from now on (omit both: show the levels)")
            pick.add_argument("--max-fa-per-hour", type=arg_type("max_fa_h"), default=None, metavar="R",
                              help="the most sensitive level `device calibrate` measured at or under R false "
                                   "accepts per hour on the place's audio")
        elif name == "adapt":
            s.add_argument("--data", type=Path, help="DIR/<label>/*.wav with bundle labels")
            s.add_argument("--recipe", default=None, choices=("plain", "speaker"),
                           help="plain (default: the clips as they are, bias-only, sgd, 200 steps) | speaker "
                                "(the base commands in your voice from ~3 clips each: full tail, adam, 1000 "
                                "steps, 16 augmented copies, 3/4 negatives per batch, a second stage per "
                                "command; pass --ambient); the options below override it")
            s.add_argument("--ambient", type=Path, nargs="+", action="extend", default=None, metavar="WAV",
                           help="everyday audio of the place that says none of the commands (TV, "
                                "conversation), trained on as _unknown_")
            s.add_argument("--strategy", default=None,
                           help="bias-only | residual-adapter | lora | sparse | full (default: the recipe's)")
            s.add_argument("--dw4", choices=("auto", "train", "freeze"), default="auto",
                           help="train the tail's depthwise layer too (auto: frozen for bias-only, whose "
                                "forward then starts after pw4, computed once per clip; see docs/edge-runtime.md)")
            s.add_argument("--optimizer", default=None, help="sgd | adam (default: the recipe's)")
            s.add_argument("--steps", type=arg_type("steps"), default=None,
                           help="training steps, at least 1 (default: the recipe's; the scheduler may run fewer "
                                "and says so)")
            s.add_argument("--augment", type=arg_type("augment"), default=None, metavar="N",
                           help="train on N shifted, re-timed, noisy copies of each command clip")
            s.add_argument("--negative-share", type=arg_type("negative_share"), default=None, metavar="F",
                           help="share of every batch drawn from _unknown_/_silence_ examples")
            s.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                           help="build a second stage for each command from its clips")
            s.add_argument("--lr", type=arg_type("lr"), default=None,
                           help="learning rate, above 0 (default: the optimizer's); a run whose loss diverges is "
                                "not committed")
            s.add_argument("--rank", type=arg_type("rank"), default=4, help="LoRA / adapter rank")
            s.add_argument("--memory-budget", type=arg_type("memory_budget"), default=256 * 1024,
                           help="bytes, for sparse")
            s.add_argument("--replay-bytes", type=arg_type("replay_bytes"), default=1 << 20,
                           help="replay buffer size (tail inputs)")
            s.add_argument("--distill", type=arg_type("distill"), default=0.5,
                           help="weight of the bundle's own outputs in the replay examples' targets "
                                "(0: labels only; see bench/forgetting)")
            s.add_argument("--context", default="default", help="name of this adapted context")
            s.add_argument("--sysfs-root", type=Path, default=Path("/"))
            s.add_argument("--force", action="store_true", help="train now, ignoring the scheduler")
            s.add_argument("--keep-versions", type=arg_type("keep_versions"), default=None, metavar="N",
                           help="adapted versions of the context kept besides its current and previous ones "
                                "(default 10; older ones are deleted after the commit)")
            s.add_argument("--rollback", action="store_true", help="restore the context's previous version")
            s.add_argument("--use", default=None, help="switch the active context ('base' for none)")
        elif name == "run":
            src = s.add_mutually_exclusive_group()
            src.add_argument("--mic", action="store_true", help="the default ALSA device (arecord)")
            s.add_argument("--mic-device", default=None, metavar="ALSA_DEVICE",
                           help="with --mic: the capture device, e.g. hw:1,0 (`arecord -l` lists them; "
                                "default: ALSA's default)")
            src.add_argument("--wav", type=Path, help="a 16 kHz mono 16-bit WAV, streamed")
            src.add_argument("--stdin", action="store_true", help="raw 16 kHz mono s16le PCM on stdin")
            # not one of the sources: a run tested on --wav or --stdin prints the unit of the same
            # options on the microphone (README), so it goes with any of them
            s.add_argument("--print-unit", action="store_true",
                           help="print a systemd unit that runs the agent on the microphone (whatever source is "
                                "given: the unit uses --mic), and exit")
            level = s.add_mutually_exclusive_group()
            level.add_argument("--threshold", type=arg_type("threshold"), default=None,
                               help="base keyword threshold (default: the version's own operating point, else 0.7)")
            level.add_argument("--sensitivity", type=arg_type("sensitivity"), default=None, metavar="FA_PER_HOUR",
                               help="per-keyword thresholds from `device calibrate`")
            s.add_argument("--keywords", default=None, help="comma-separated base keywords, or 'all'")
            s.add_argument("--confirm", type=arg_type("confirm"), default=0.9,
                           help="base-keyword detections at or above this score feed the replay buffer")
            add_second_stage(s)
            s.add_argument("--on-detect", default=None, metavar="COMMAND",
                           help="shell command run for each detection (the event as JSON on stdin and in "
                                "$EDGELEARN_EVENT; $EDGELEARN_KEYWORD, $EDGELEARN_SCORE, $EDGELEARN_TIME_S)")
            s.add_argument("--data", type=Path, default=None,
                           help="labelled clips DIR/<label>/*.wav: local adaptation, federated examples, "
                                "the health check of new versions")
            s.add_argument("--strategy", default="bias-only", help="what local adaptation trains")
            s.add_argument("--keep-versions", type=arg_type("keep_versions"), default=None, metavar="N",
                           help="adapted versions kept besides the current and previous ones (default 10)")
            s.add_argument("--no-adapt", action="store_true",
                           help="never adapt locally: --data's clips serve the federated rounds and the "
                                "health check only")
            s.add_argument("--adapt-every", type=float, default=3600.0, metavar="S",
                           help="seconds between asking the scheduler for an adaptation run")
            s.add_argument("--aggregator", default=None, metavar="URL", help="join this federation")
            s.add_argument("--device-id", default=None)
            s.add_argument("--device-key", type=Path, default=None, help="the key file `aggregator provision` wrote")
            s.add_argument("--checkin-every", type=float, default=600.0, metavar="S",
                           help="seconds between check-ins with the aggregator")
            s.add_argument("--network", default="wifi", help="what the check-in reports (wifi, ethernet, cellular)")
            s.add_argument("--wyoming", default=None, metavar="URI",
                           help="also serve the keywords to Home Assistant as a Wyoming wake-word service at "
                                "tcp://HOST:PORT (edgelearn wyoming, in this process); alone, without a local "
                                "audio source, the agent serves only its satellites")
            from edge.commands.wyoming import add_zeroconf_argument
            add_zeroconf_argument(s)
            s.add_argument("--sysfs-root", type=Path, default=Path("/"))


def _device(args) -> Device:
    return Device(args.state, args.bundle, backend=args.backend, trusted_keys=args.pubkey,
                  sysfs_root=getattr(args, "sysfs_root", "/"))


def run(args) -> int:
    return {"detect": _detect, "enroll": _enroll, "adapt": _adapt, "status": _status,
            "calibrate": _calibrate, "run": _run, "sensitivity": _sensitivity}[args.action](args)


def _keywords(arg):
    if not arg:
        return None
    return "all" if arg == "all" else [w.strip() for w in arg.split(",") if w.strip()]


def _one_or_list(pubkeys):
    """--pubkey (repeatable) as the agent takes it: None, the one path given (a unit and the adapt child
    carry it as one option), or the list (``TrustedKeys``: passed on as one string it keeps every key).
    The shipped release keys are added where bundles are opened (``edge.kws.resolve_trusted_keys``)."""
    from edge.kws import TrustedKeys

    return pubkeys[0] if pubkeys and len(pubkeys) == 1 else (TrustedKeys(pubkeys) if pubkeys else None)


def _run(args) -> int:
    import signal

    from edge.agent import Agent, AgentConfig, service_unit

    from edge.errors import EdgelearnError

    if not (args.mic or args.wav or args.stdin or args.print_unit or args.wyoming):
        raise EdgelearnError("device run needs audio", fix="pass --mic, --wav F or --stdin, or --wyoming URI "
                                                           "to hear Home Assistant's satellites")
    if args.zeroconf and not args.wyoming:
        raise EdgelearnError("--zeroconf announces the Wyoming server, and this agent serves none",
                             fix="pass --wyoming tcp://HOST:PORT with --zeroconf")
    source = ("mic" if args.mic or args.print_unit else "stdin" if args.stdin else str(args.wav) if args.wav
              else "none")
    cfg = AgentConfig(source=source,
                      on_detect=args.on_detect, keywords=_keywords(args.keywords), threshold=args.threshold,
                      sensitivity=args.sensitivity, confirm=args.confirm, asr=second_stage(args), data=args.data,
                      strategy=args.strategy, keep_versions=args.keep_versions,
                      adapt_every_s=args.adapt_every, adapt=not args.no_adapt, aggregator=args.aggregator,
                      device_id=args.device_id, device_key=args.device_key, checkin_every_s=args.checkin_every,
                      network=args.network, wyoming=args.wyoming, zeroconf=args.zeroconf,
                      mic_device=args.mic_device)
    if args.mic_device and source != "mic":
        raise EdgelearnError("--mic-device picks the microphone, and this run reads none",
                             fix="pass --mic with --mic-device")
    if args.print_unit:
        print(service_unit(args.state, cfg, bundle=args.bundle, trusted_keys=_one_or_list(args.pubkey),
                           backend=args.backend, sysfs_root=args.sysfs_root), end="")
        return 0
    agent = Agent(args.state, cfg, args.bundle, trusted_keys=_one_or_list(args.pubkey), backend=args.backend,
                  sysfs_root=args.sysfs_root)
    signal.signal(signal.SIGTERM, agent.stop)
    interrupted = []

    def on_sigint(*_):  # Ctrl-C: a clean stop (agent.json final); a second one ends it at once
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(True)
        agent.stop()

    signal.signal(signal.SIGINT, on_sigint)
    agent.run()
    if interrupted:
        print("edgelearn device: interrupted", file=sys.stderr)
        return 130
    return 0


def add_second_stage(p) -> None:
    """``--asr`` / ``--phrase`` / ``--no-phrase``: the base commands' second stage (``device detect``,
    ``device run``, ``wyoming``); given none, the default operating point's (``Device.detect``'s
    ``asr="auto"``)."""
    stage = p.add_mutually_exclusive_group()
    stage.add_argument("--asr", action="store_true",
                       help="a recogniser trained on real speech (PocketSphinx) confirms each base-keyword "
                            "detection; first stage at 0.3 unless --threshold (pip install 'edgelearn[asr]')")
    stage.add_argument("--phrase", action="store_true",
                       help="the bundle's phrase model of each command confirms its detections also with "
                            "--threshold, --sensitivity or an adapted model (without them it is the default "
                            "wherever the bundle ships phrase models)")
    stage.add_argument("--no-phrase", action="store_true",
                       help="the first stage alone at the bundle's own thresholds (no second stage)")


def second_stage(args):
    """``--asr`` / ``--phrase`` / ``--no-phrase`` as ``Device.detect``'s ``asr`` (none given: "auto")."""
    if getattr(args, "phrase", False):
        return "phrase"
    if args.asr:
        return True
    return False if getattr(args, "no_phrase", False) else "auto"


def _detect(args) -> int:
    kws = _keywords(args.keywords)
    events = _device(args).detect(None if args.mic else args.wav, mic=(args.mic_device or True) if args.mic else False,
                                  keywords=kws,
                                  threshold=args.threshold if args.sensitivity is None else None,
                                  sensitivity=args.sensitivity, stride=args.stride, confirm=args.confirm,
                                  replay=not args.no_replay, asr=second_stage(args))
    for ev in events:
        print(json.dumps(ev) if args.json else f"{ev['time_s']:9.2f} s  {ev['keyword']:<16} {ev['score']:.2f}",
              flush=True)
    return 0


def _calibrate(args) -> int:
    from edge.errors import EdgelearnError

    try:
        targets = sorted({float(t) for t in args.targets.split(",") if t.strip()})
    except ValueError:
        raise EdgelearnError(f"--targets {args.targets!r} is not a list of numbers",
                             fix="pass e.g. --targets 0.5,1,2") from None
    dev = _device(args)
    table = dev.calibrate(args.wav, targets)
    hours = table["hours"]
    # "thresholds": the first stage's alone (--no-phrase); "phrase": both stages, what a sensitivity runs
    print(json.dumps({"hours": round(hours, 3), "points": [
        {"target_fa_h": p["target_fa_h"], "thresholds": p["thresholds"],
         **({"phrase": {k: p["phrase"][k] for k in ("first_stage", "cutoffs")}} if "phrase" in p else {})}
        for p in table["points"]]}))
    if hours < 1.0:
        print(f"warning: {_duration(hours * 3600)} of audio pin a rate of {min(targets):g} per hour "
              "only loosely; calibrate on an hour or more", file=sys.stderr)
    return 0


def _duration(seconds: float) -> str:
    """``45 seconds``, ``2 minutes``: the calibrate warning once said "1 minutes" (under 90 s, seconds)."""
    if seconds < 90:
        n, unit = round(seconds), "second"
    else:
        n, unit = round(seconds / 60), "minute"
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _enroll(args) -> int:
    rep = _device(args).enroll(args.keyword, args.wav, replace=args.replace, add=args.add,
                               sensitivity=args.sensitivity)
    for o in rep["outliers"]:
        print(f"warning: {o['clip']} does not sound like the others (cosine {o['cosine']}); left out",
              file=sys.stderr)
    if isinstance(rep.get("other_voices"), str):  # taught other voices, and the path could not be kept
        print(f"warning: {rep['keyword']}: other voices {rep['other_voices']}", file=sys.stderr)
    print(json.dumps(rep))
    return 0


def _adapt(args) -> int:
    dev = _device(args)
    if args.rollback or args.use:  # a bad option is refused at parsing, with these too (arg_type)
        if args.rollback:
            print(json.dumps({"context": args.context, "version": dev.rollback(args.context)}))
        else:
            print(json.dumps({"active": dev.use(None if args.use == "base" else args.use)}))
        return 0
    res = dev.adapt(args.data, recipe=args.recipe, strategy=args.strategy, optimizer=args.optimizer,
                    steps=args.steps, rank=args.rank, memory_budget=args.memory_budget,
                    replay_bytes=args.replay_bytes, distill=args.distill, context=args.context,
                    dw4=args.dw4, ambient=args.ambient, augment=args.augment,
                    negative_share=args.negative_share, verify=args.verify, lr=args.lr, force=args.force,
                    keep_versions=args.keep_versions)
    print(json.dumps(res))
    if res.get("status") == "diverged":  # nothing was committed: a script must see it failed
        print(f"edgelearn device adapt: {res.get('reason', 'training diverged')}", file=sys.stderr)
        return 1
    return 0


def _sensitivity(args) -> int:
    print(json.dumps(_device(args).sensitivity(args.keyword, args.level, args.max_fa_per_hour)))
    return 0


def _status(args) -> int:
    print(json.dumps(_device(args).status(), indent=1))
    return 0
