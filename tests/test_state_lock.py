"""The device state lock (issue: two commands on one state lost an enrolled keyword, a calibration or
replay examples, and both said they succeeded): every read-modify-write of keywords.json,
operating.json and the replay buffers re-reads the file under ``ST/.lock`` and merges. Each test runs
a second, real process that writes the state while this one holds what it read; and calibrating on
NaN targets or seconds of audio is refused with the old table kept."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from devstate_helpers import make_keyword_clips
from edge.audio import write_wav
from edge.device import Device
from edge.errors import EdgelearnError
from edge.replay import ReplayStore

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, wait=True):
    cmd = [sys.executable, "-m", "edge.cli", "device", *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def names(st) -> list[str]:
    return [k["name"] for k in json.loads((st / "keywords.json").read_text())["keywords"]]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("clips")
    return {kw: make_keyword_clips(root / kw.split()[0], n=3, seed=s)
            for s, kw in enumerate(("alpha robot", "bravo robot", "charlie robot"), 1)}


@pytest.fixture()
def state(clips, tmp_path):
    st = tmp_path / "st"
    Device(st).enroll("alpha robot", clips["alpha robot"])
    return st


def test_an_enrolment_saved_while_another_process_enrolled_keeps_both(state, clips):
    from edge.enroll import enroll

    dev = Device(state)
    mine = dev.enrolled()  # read before the other process writes
    enroll(dev.keyword_model(), mine, "bravo robot", [np.asarray(c) for c in map(_pcm, clips["bravo robot"])],
           save=False)
    r = cli("enroll", "--state", state, "--keyword", "charlie robot", "--wav", *clips["charlie robot"])
    assert r.returncode == 0, r.stderr
    mine.save()  # used to write the file as this process read it, plus bravo: charlie was gone
    assert sorted(names(state)) == ["alpha robot", "bravo robot", "charlie robot"]
    assert Device(state).status()["keywords"] == names(state)


def test_the_same_keyword_enrolled_meanwhile_is_refused_unless_replaced(state, clips):
    from edge.enroll import enroll

    dev = Device(state)
    mine = dev.enrolled()
    enroll(dev.keyword_model(), mine, "bravo robot", [_pcm(c) for c in clips["bravo robot"]], save=False)
    r = cli("enroll", "--state", state, "--keyword", "bravo robot", "--wav", *clips["charlie robot"])
    assert r.returncode == 0, r.stderr
    theirs = (state / "keywords.json").read_bytes()
    with pytest.raises(EdgelearnError, match="enrolled by another command") as e:
        mine.save()
    assert "--replace" in e.value.fix
    assert (state / "keywords.json").read_bytes() == theirs  # nothing written
    mine.save(prefer="ours")  # what `enroll --replace` asks for
    assert names(state) == ["alpha robot", "bravo robot"]
    ours = [k for k in json.loads((state / "keywords.json").read_text())["keywords"] if k["name"] == "bravo robot"]
    assert ours[0]["w"] == mine.keywords[-1]["w"]


def test_an_enrolment_waits_for_the_lock_and_then_writes(state, clips):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; sys.path.insert(0, %r)\n"
        "from edge.atomic import state_lock\n"
        "with state_lock(%r):\n"
        "    print('held', flush=True); sys.stdin.readline()\n") % (str(ROOT), str(state))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (state / "keywords.json").read_bytes()
        enrol = cli("enroll", "--state", state, "--keyword", "bravo robot", "--wav", *clips["bravo robot"], wait=False)
        inode = (state / ".lock").stat().st_ino
        while not _waits_on(inode):  # the enrolment has computed its keyword and waits for the lock
            assert enrol.poll() is None, "the enrolment wrote while another process held the state lock: " + \
                enrol.stderr.read()
            time.sleep(0.05)
        assert (state / "keywords.json").read_bytes() == before
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait() == 0
        out, err = enrol.communicate()
        assert enrol.returncode == 0, err
    finally:
        holder.kill()
    assert names(state) == ["alpha robot", "bravo robot"]


def _waits_on(inode: int) -> bool:
    """Does a process wait for an flock on the file with this inode (/proc/locks: "-> " lines)?"""
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts and "FLOCK" in parts and parts[parts.index("->") + 5].split(":")[-1] == str(inode):
            return True
    return False


def test_calibrate_keeps_a_keyword_enrolled_while_it_measured(state, clips, tmp_path):
    wav = write_wav(tmp_path / "place.wav", (np.random.default_rng(0).standard_normal(16000 * 31) * 300)
                    .astype(np.int16))
    dev = Device(state)
    detector, calls = dev.detector, []

    def enrol_meanwhile(**kw):  # while calibrate measures the enrolled keywords, another process enrols
        if not calls:
            r = cli("enroll", "--state", state, "--keyword", "bravo robot", "--wav", *clips["bravo robot"])
            assert r.returncode == 0, r.stderr
        calls.append(kw)
        return detector(**kw)

    dev.detector = enrol_meanwhile
    table = dev.calibrate([wav], targets=[5.0])
    assert calls and sorted(names(state)) == ["alpha robot", "bravo robot"]  # bravo used to be overwritten
    kws = {k["name"]: k for k in json.loads((state / "keywords.json").read_text())["keywords"]}
    assert "fa_per_hour" in kws["alpha robot"] and "fa_per_hour" not in kws["bravo robot"]
    assert set(table["enrolled"]) == {"alpha robot"}
    assert json.loads((state / "operating.json").read_text())["points"][0]["target_fa_h"] == 5.0


def test_a_sensitivity_set_while_another_process_calibrated_keeps_both(state, tmp_path):
    from edge.enroll import keyword_sensitivity

    wav = write_wav(tmp_path / "place.wav", (np.random.default_rng(1).standard_normal(16000 * 31) * 300)
                    .astype(np.int16))
    mine = Device(state).enrolled()
    r = cli("calibrate", "--state", state, "--wav", wav, "--targets", "5")
    assert r.returncode == 0, r.stderr
    measured = json.loads((state / "keywords.json").read_text())["keywords"][0]["fa_per_hour"]
    assert keyword_sensitivity(mine, "alpha robot", "high")["sensitivity"] == "high"
    [kw] = json.loads((state / "keywords.json").read_text())["keywords"]
    assert kw["sensitivity"] == "high" and kw["fa_per_hour"] == measured  # the measurement used to be lost


def test_calibrate_refuses_targets_that_are_not_rates_and_far_too_little_audio(state, tmp_path):
    old = json.dumps({"for": {}, "points": [{"target_fa_h": 1.0, "thresholds": {"yes": 0.8}}]}).encode()
    (state / "operating.json").write_bytes(old)
    kw = (state / "keywords.json").read_bytes()
    wav = write_wav(tmp_path / "long.wav", (np.random.default_rng(0).standard_normal(16000 * 31) * 300)
                    .astype(np.int16))
    for bad in ("nan", "inf", "0", "-1", "0.5,nan"):
        r = cli("calibrate", "--state", state, "--wav", wav, "--targets", bad)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "--targets" in r.stderr, r.stderr
    with pytest.raises(EdgelearnError, match="finite rates above 0"):
        Device(state).calibrate([wav], targets=[float("nan")])
    short = write_wav(tmp_path / "short.wav", np.zeros(24000, np.int16))  # 1.5 s of silence
    r = cli("calibrate", "--state", state, "--wav", short)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "1.5 s" in r.stderr and "30 s" in r.stderr and "minutes" in r.stderr, r.stderr
    assert (state / "operating.json").read_bytes() == old  # the earlier calibration is kept
    assert (state / "keywords.json").read_bytes() == kw


WRITER = r"""
import sys, numpy as np
sys.path.insert(0, %(root)r)
from edge.replay import ReplayStore
rs = ReplayStore(%(state)r, dim=16, max_bytes=1 << 16, flush_every=%(every)d)
for i in range(%(n)d):
    rs.add(np.full(16, %(value)d, np.float32), %(label)d)
rs.flush()
"""


def _writer(state, n, label, value, every=1):
    code = WRITER % {"root": str(ROOT), "state": str(state), "n": n, "label": label, "value": value, "every": every}
    return subprocess.Popen([sys.executable, "-c", code])


def test_replay_adds_of_another_process_are_kept_when_this_one_flushes(tmp_path):
    mine = ReplayStore(tmp_path, dim=16, max_bytes=1 << 16, flush_every=1000)
    mine.add(np.full(16, 1, np.float32), 1)
    mine.flush()  # the file holds 1 example; this process reads it...
    mine.add(np.full(16, 1, np.float32), 1)
    mine.add(np.full(16, 1, np.float32), 1)
    assert _writer(tmp_path, 3, label=2, value=2).wait() == 0  # ...another adds 3 and writes
    mine.flush()
    on_disk = ReplayStore(tmp_path, dim=16)
    assert on_disk.count == 6 and on_disk.buffer.class_counts() == {1: 3, 2: 3}  # used to be 3 (the last writer's)
    assert on_disk.buffer.to_bytes() == mine.buffer.to_bytes()
    x, y = on_disk.arrays(range(on_disk.buffer.capacity))
    assert all(np.allclose(v, lab) for v, lab in zip(x, y) if lab != 0xFFFF)  # each example is its own
    # the adapt commit's image (staged, then mark_saved) is a merge too
    mine.add(np.full(16, 1, np.float32), 1)
    assert _writer(tmp_path, 2, label=2, value=2).wait() == 0
    staged = mine.staged()
    mine.mark_saved()
    assert mine.count == 9
    from edge.portable.replay import ReplayBuffer

    assert ReplayBuffer.from_bytes(staged).class_counts() == {1: 4, 2: 5}


def test_two_processes_feeding_one_replay_file_at_once_lose_nothing(tmp_path):
    procs = [_writer(tmp_path, 40, label=lab, value=lab) for lab in (3, 4)]  # 40 writes each, at once
    assert [p.wait() for p in procs] == [0, 0]
    rs = ReplayStore(tmp_path, dim=16)
    assert rs.buffer.capacity >= 80 and rs.buffer.class_counts() == {3: 40, 4: 40}


def _pcm(path):
    from edge.audio import read_wav

    return read_wav(path, min_samples=1)


def test_a_replay_flush_while_adapt_commits_waits_and_both_are_kept(tmp_path, monkeypatch):
    """``device adapt`` stages the replay buffer (a merge of the file as it is) and renames it into
    place in its commit; a flush of the same file by another writer in between used to be
    overwritten. The writer here is a thread (the lock is per process, so a thread of this one
    waits for it as another process would)."""
    import threading

    from devstate_helpers import make_data

    from edge.adapt.store import AdaptStore
    from edge.replay import TAIL_REPLAY, load_replay

    data = make_data(tmp_path / "data")
    dev = Device(tmp_path / "st")
    assert dev.adapt(data, force=True)["status"] == "done"
    path = dev.state_dir / TAIL_REPLAY
    dim = load_replay(path).dim
    label = max(load_replay(path).class_counts()) + 1
    real_save, threads = AdaptStore.save, []

    def other_writer():
        rs = ReplayStore(dev.state_dir, dim=dim, name=TAIL_REPLAY, flush_every=1000)
        rs.add(np.full(dim, 0.5, np.float32), label)
        rs.flush()

    def save(self, *a, **kw):  # the staged image is made; now the other writer flushes
        threads.append(threading.Thread(target=other_writer))
        threads[-1].start()
        threads[-1].join(timeout=2.0)  # with the commit under the state lock it waits here
        return real_save(self, *a, **kw)

    monkeypatch.setattr(AdaptStore, "save", save)
    assert dev.adapt(data, force=True)["status"] == "done"
    threads[0].join()
    counts = load_replay(path).class_counts()
    assert counts.get(label) == 1, counts  # used to be lost: the commit renamed its image over it
    assert sum(counts.values()) > 1
