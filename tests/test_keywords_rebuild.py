"""A damaged ``keywords.json`` (truncated, garbage, empty: an SD card gone bad) is rebuilt by the next
command from the clips the device kept for each keyword (``ST/enrolment/*.npz``): the same entries
``device enroll`` made, so detection scores the same; the damaged bytes kept as
``keywords.json.damaged``; one warning line. It used to stop every command with "restore it or
delete it and enrol again", which lost every keyword.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge.audio import write_wav

ROOT = Path(__file__).resolve().parents[1]
RATES = ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9), (1.0, 1.0), (0.97, 1.03))
KWS = ("hey robot", "lights on")


def cli(*args, wait=True):
    cmd = [sys.executable, "-m", "edge.cli", "device", *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def warnings(stderr: str) -> list[str]:
    out = []
    for line in stderr.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "warning" in doc:
            out.append(doc["warning"])
    return out


def keywords(st: Path) -> list[dict]:
    return json.loads((st / "keywords.json").read_text())["keywords"]


def detect(st: Path, wav: Path):
    r = cli("detect", "--state", st, "--wav", wav, "--json", "--no-replay")
    return r, [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two keywords enrolled from rendered speech with `device enroll`, a held-out stream saying each
    of them twice, and what detection found in it."""
    from host.data import synth

    base = tmp_path_factory.mktemp("rebuild")
    voice = synth.Voice("flite", "rms")
    wavs, held = {}, []
    for kw in KWS:
        clips = synth.render(voice, [(kw, r, p) for r, p in RATES])
        d = base / kw.replace(" ", "_")
        d.mkdir()
        wavs[kw] = [write_wav(d / f"{i}.wav", c) for i, c in enumerate(clips[:5])]
        held.append(clips[5:])
    rng = np.random.default_rng(3)
    parts = [np.zeros(20000, np.float32)]
    for c in (held[0][0], held[1][0], held[0][1], held[1][1]):
        parts += [c.astype(np.float32), np.zeros(24000, np.float32)]
    x = np.concatenate(parts)
    x += rng.standard_normal(x.size).astype(np.float32) * 50
    stream = write_wav(base / "held_out.wav", x.astype(np.int16))
    st = base / "st"
    for kw in KWS:
        r = cli("enroll", "--state", st, "--keyword", kw, "--wav", *wavs[kw])
        assert r.returncode == 0, r.stderr
    r, events = detect(st, stream)
    assert r.returncode == 0, r.stderr
    assert sorted({e["keyword"] for e in events}) == sorted(KWS)  # the comparison below means something
    return {"state": st, "stream": stream, "events": events, "keywords": keywords(st), "wavs": wavs,
            "raw": (st / "keywords.json").read_bytes()}


def copy_state(world, tmp_path) -> Path:
    st = tmp_path / "st"
    shutil.copytree(world["state"], st)
    return st


DAMAGE = {"truncated": lambda raw: raw[: len(raw) // 3],
          "garbage": lambda raw: np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
          "empty": lambda raw: b"",
          "zeroed": lambda raw: bytes(len(raw))}  # a block the card gave back as zeros


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_keywords_file_is_rebuilt_and_detects_the_same(world, tmp_path, how):
    st = copy_state(world, tmp_path)
    bad = DAMAGE[how](world["raw"])
    (st / "keywords.json").write_bytes(bad)
    r, events = detect(st, world["stream"])
    assert r.returncode == 0, r.stderr
    [line] = warnings(r.stderr)
    assert "keywords.json was damaged" in line and "kept as keywords.json.damaged" in line
    assert "rebuilt 2 keywords from their enrolment clips (hey robot, lights on)" in line
    assert "lost" not in line and "no settings" not in line
    assert events == world["events"]  # the same detections, the same scores
    assert keywords(st) == world["keywords"]  # the very entries `device enroll` wrote
    assert (st / "keywords.json.damaged").read_bytes() == bad
    assert (st / "keywords.json").stat().st_mode & 0o777 == 0o600
    r = cli("status", "--state", st)  # rebuilt once: the next command reads it as it is
    assert r.returncode == 0 and warnings(r.stderr) == [], r.stderr
    assert json.loads(r.stdout)["keywords"] == list(KWS)


def test_a_damaged_clips_file_loses_only_its_keyword(world, tmp_path):
    st = copy_state(world, tmp_path)
    (kept,) = (st / "enrolment").glob("lights_on-*.npz")
    kept.write_bytes(kept.read_bytes()[:1000])
    (st / "keywords.json").write_bytes(b"\x00" * 100)
    r = cli("status", "--state", st)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["keywords"] == ["hey robot"]
    [line] = warnings(r.stderr)
    assert "rebuilt 1 keyword from their enrolment clips (hey robot)" in line
    assert "lost (enrol again): lights on (its kept clips" in line and "are damaged" in line
    assert keywords(st) == [world["keywords"][0]]  # trained against lights on's prototype, as enrolled
    r, events = detect(st, world["stream"])
    assert r.returncode == 0 and warnings(r.stderr) == [], r.stderr
    mine = [e for e in events if e["keyword"] == "hey robot"]  # (the base keyword "on" now fires too)
    assert mine == [e for e in world["events"] if e["keyword"] == "hey robot"]
    # the lost keyword is enrolled again as usual (its damaged clips replaced)
    r = cli("enroll", "--state", st, "--keyword", "lights on", "--wav", *world["wavs"]["lights on"])
    assert r.returncode == 0, r.stderr
    assert [k["name"] for k in keywords(st)] == list(KWS)


def test_sensitivity_speakers_and_measured_rates_come_back(world, tmp_path):
    from edge.device import Device

    st = copy_state(world, tmp_path)
    dev = Device(st)
    dev.enroll("hey robot", world["wavs"]["lights on"], add=True)  # a second "speaker" (any 5 clips do)
    dev.sensitivity("lights on", "high")
    rng = np.random.default_rng(1)
    amb = write_wav(tmp_path / "everyday.wav", (rng.standard_normal(16000 * 40) * 800).astype(np.int16))
    dev.calibrate([amb])
    before = keywords(st)
    by = {k["name"]: k for k in before}  # (enrolled again, hey robot is now the last)
    assert by["hey robot"]["speakers"] == 2 and by["lights on"]["sensitivity"] == "high"
    assert "fa_per_hour" in by["lights on"] and "fa_per_hour" in by["hey robot"]
    (st / "keywords.json").write_bytes(b"{\"format\": 2, \"model_id\": \"kws")
    r = cli("status", "--state", st)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sensitivity"] == {"hey robot": "medium", "lights on": "high"}
    [line] = warnings(r.stderr)
    assert "rebuilt 2 keywords" in line and "no settings" not in line and "calibrate" not in line
    assert keywords(st) == before  # both speakers' heads, the level, the measured rates


def test_clips_kept_before_they_carried_their_name_are_found(world, tmp_path):
    """Kept clips files written before 2026-12-06 hold only the clips and speakers, and there was no
    settings.json: the names come from the file names' digests, and the warning says which levels
    were taken as enrolled."""
    st = copy_state(world, tmp_path)
    (st / "enrolment" / "settings.json").unlink()
    for p in sorted((st / "enrolment").glob("*.npz")):  # oldest first, as they were enrolled
        with np.load(p) as z:
            old = {k: z[k] for k in z.files if k.startswith("clip_") or k == "speakers"}
        np.savez(p, **old)
    (st / "keywords.json").write_bytes(b"garbage")
    r = cli("status", "--state", st)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["keywords"] == list(KWS)
    [line] = warnings(r.stderr)
    assert "rebuilt 2 keywords" in line
    assert "the sensitivity is the enrolment's (hey robot medium, lights on medium)" in line
    # the first was enrolled against nothing but the bank, the second against the first: as before
    assert keywords(st) == world["keywords"]


def test_two_commands_at_once_rebuild_it_once(world, tmp_path):
    st = copy_state(world, tmp_path)
    (st / "keywords.json").write_bytes(b"")
    procs = [cli("status", "--state", st, wait=False) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    said = [w for _, err in outs for w in warnings(err)]
    assert len(said) == 1 and "rebuilt 2 keywords" in said[0]
    assert (st / "keywords.json.damaged").read_bytes() == b""
    assert keywords(st) == world["keywords"]


def test_without_kept_clips_or_for_another_version_nothing_is_rebuilt(world, tmp_path):
    from edge.device import Device
    from edge.errors import EdgelearnError

    st = copy_state(world, tmp_path)
    (st / "keywords.json").write_bytes(b"garbage")
    # the state runs another version (the adapt pointer says so): a command probing this one, as the
    # agent's check of a newly installed version does, must not bind the keywords to it
    (st / "adapt").mkdir()
    (st / "adapt" / "active.json").write_text(json.dumps({"active": None, "model": ["kws-dscnn-s", 999],
                                                          "contexts": {}}))
    with pytest.raises(EdgelearnError, match="runs kws-dscnn-s v999"):
        Device(st).enrolled()
    assert (st / "keywords.json").read_bytes() == b"garbage" and not (st / "keywords.json.damaged").exists()
    shutil.rmtree(st / "adapt")
    shutil.rmtree(st / "enrolment")  # enrolled before the device kept clips: the sentence as before
    with pytest.raises(EdgelearnError, match="restore it from a backup"):
        Device(st).enrolled()
    assert (st / "keywords.json").read_bytes() == b"garbage" and not (st / "keywords.json.damaged").exists()


def test_a_hand_edit_that_parses_is_an_error_not_rebuilt(world, tmp_path):
    from edge.device import Device
    from edge.errors import EdgelearnError

    st = copy_state(world, tmp_path)
    doc = json.loads(world["raw"])
    doc["keywords"][0]["threshold"] = "high"
    (st / "keywords.json").write_text(json.dumps(doc))
    with pytest.raises(EdgelearnError, match="'threshold' is 'high'"):
        Device(st).enrolled()
    assert not (st / "keywords.json.damaged").exists()
