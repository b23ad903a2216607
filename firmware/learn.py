"""Learning phase of the firmware: finish an enrolment, adapt on feedback, keep the replay buffer.

Imported for the ``enrolled`` and ``feedback`` commands and unloaded after
them (firmware/app.py ``unload``). The replay buffer (``edge.portable.replay``)
and the schedule policy (``edge.portable.schedule``) live on flash between
these commands (``state/replay.bin``, ``state/sched.bin``): they are read,
changed and written back here, so neither their code nor the buffer's 4 KB
sits in the heap while the board only listens.

    from firmware import learn
    learn.enrolled(app, [])           # "ok keyword kw id=0 threshold=0.8 outliers=0"
"""

from edge.portable.compat import const
from edge.portable.proto import ProtoHead, find_outliers, loo_cosines, prototype
from edge.portable.replay import ReplayBuffer, count_in_file
from firmware.app import MAX_KEYWORDS, REPLAY_BYTES, AppError
from firmware.board import atomic_write, read_file

SHOTS = const(5)
NOT_A_KEYWORD = const(0xFFFE)


def load_replay(app, dim):
    """The persisted replay buffer, or a fresh one when missing, unreadable or of another dimension."""
    rb = None
    try:
        with open(app.board.path("state/replay.bin"), "rb") as f:
            rb = ReplayBuffer.read_from(f, store=app.replay_store)   # read in place, into the boot-time buffer
    except OSError:
        pass
    except ValueError:
        app.events.append("state/replay.bin unreadable; starting an empty buffer")
    if rb is None or rb.dim != dim:
        rb = ReplayBuffer(dim, REPLAY_BYTES, store=app.replay_store)
    return rb


def replay_count(app):
    try:
        with open(app.board.path("state/replay.bin"), "rb") as f:
            return count_in_file(f)
    except (OSError, ValueError):
        return 0


def _save_replay(app, rb):
    app.save("replay.bin", (rb.header(), rb.body))
    app.replay_count = rb.count


def policy(app):
    if app.policy is not None:
        return app.policy
    from edge.portable.schedule import SchedulePolicy
    pol = SchedulePolicy()
    raw = read_file(app.board.path("state/sched.bin"))
    if raw is not None:
        try:
            pol.load_state(raw)
        except ValueError:
            pass
    return pol


def readings(app):
    from edge.portable.schedule import Readings
    b = app.board
    return Readings(battery_pct=b.battery_pct(), charging=b.charging(), has_battery=True,
                    temp_c=b.temp_c(), idle_s=3600, now_s=app.now_s)


def enrolled(app, args):
    if app.enrol_name is None or len(app.shots) < SHOTS:
        raise AppError("need %d shots, have %d" % (SHOTS, len(app.shots)), "record more shots")
    bad = find_outliers(app.shots)
    good = [e for i, e in enumerate(app.shots) if i not in bad]
    if len(good) < 3:
        raise AppError("the shots disagree (%d outliers)" % len(bad), "record the keyword again, clearly")
    cos = loo_cosines(good)
    lo = 1.0
    for i in range(len(cos)):
        c = float(cos[i])
        lo = c if c < lo else lo
    thr = max(0.5, min(0.95, lo - 0.05))
    head = ProtoHead.from_bytes(app.head.to_bytes(), MAX_KEYWORDS)
    names = list(app.names)
    k = head.add(prototype(good), thr)
    names.append(app.enrol_name)
    _save_keywords(app, head, names)   # raises before anything in RAM changes
    app.head, app.names = head, names
    rb = load_replay(app, app.dim)
    for e in good:
        rb.add(e, k)
    try:
        _save_replay(app, rb)
    except AppError as e:  # the keyword is saved; the replay entries are best-effort
        app.events.append("replay not saved: %s" % e.problem)
    app.enrol_name, app.shots = None, []
    return "ok keyword %s id=%d threshold=%.4f outliers=%d" % (names[k], k, thr, len(bad))


def _save_keywords(app, head, names):
    import json
    cfg = json.loads(read_file(app.board.path("config.json")) or b"{}")
    cfg["keywords"] = names
    app.save("head.bin", head.to_bytes())
    try:
        atomic_write(app.board.path("config.json"), json.dumps(cfg).encode())
    except OSError:
        raise AppError("could not save config.json (filesystem full?)", "free space on the board and retry")


def feedback(app, args):
    label = int(args[0]) if args else -2
    if label < -1 or label >= app.head.count:
        raise AppError("feedback label must be -1 (not a keyword) or 0..%d" % (app.head.count - 1))
    pol = policy(app)
    d = pol.decide(readings(app))
    if d.action != "train":
        return "ok skipped (%s)" % d.reason
    # the step changes only the biases: take it in place and put them back if the save fails
    # (a copy of the whole head would be a second block of its size in the heap)
    head = app.head
    before = list(head.bias)
    loss = head.adapt_bias(app.emb, label)
    try:
        app.save("head.bin", head.to_bytes())
    except AppError:
        for i in range(len(before)):
            head.bias[i] = before[i]
        raise
    pol.spend(1, app.now_s)
    try:  # the replay buffer and the day's energy spend are best-effort: the head is saved already
        rb = load_replay(app, app.dim)
        rb.add(app.emb, label if label >= 0 else NOT_A_KEYWORD)
        _save_replay(app, rb)
        app.save("sched.bin", pol.state_bytes())
    except AppError as e:
        app.events.append("replay not saved: %s" % e.problem)
    return "ok adapted loss=%.4f" % loss
