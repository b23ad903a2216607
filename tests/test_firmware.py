"""The firmware application on CPython with a FakeBoard: enrol, detect, adapt, update, and bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from edge.portable.wire import AuthError, decode_update
from edge.portable import link as L
from firmware.app import App
from firmware.board import FakeBoard
from host.board.fs import DEFAULT_BUNDLE, board_files, install_local, phrase_clips

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(), reason="MCU bundle not built")
KEY = bytes(range(32))


class Driver:
    def __init__(self, fs: Path):
        self.fs = fs
        self.app = App(FakeBoard(root=str(fs) + "/"))
        self.seq = 0

    def send(self, kind, payload):
        self.seq += 1
        return self.app.handle(kind, self.seq, payload)

    def cmd(self, text):
        out = self.send(L.CMD, text.encode())
        kind, p = out[0]
        return kind, p[2:].decode(), out[1:]

    def clip(self, pcm):
        assert self.cmd("clip")[0] == L.ACK
        raw = pcm.astype("<i2").tobytes()
        for a in range(0, len(raw), 2048):
            assert self.send(L.AUDIO, raw[a:a + 2048])[0][0] == L.ACK


@pytest.fixture()
def fs(tmp_path):
    files = board_files(tmp_path / "work", DEFAULT_BUNDLE, "esp32-test", KEY, bundle_dest="bundle")
    install_local(files, tmp_path / "fs")
    return tmp_path / "fs"


@pytest.fixture(scope="module")
def clips():
    return phrase_clips(6)[0]


def enrol(d, name, pcms):
    assert d.cmd(f"enrol {name}")[0] == L.ACK
    for pcm in pcms:
        d.clip(pcm)
        kind, text, _ = d.cmd("shot")
        assert kind == L.ACK, text
    return d.cmd("enrolled")


def test_enrol_detect_adapt_and_update_verifies_on_host(fs, clips):
    d = Driver(fs)
    (a, pa), (b, pb) = list(clips.items())
    kind, text, _ = enrol(d, "kw", pa[:5])
    assert kind == L.ACK and "keyword kw id=0" in text
    d.clip(pa[5])
    same = float(d.cmd("detect")[1].split("cos=")[1].split()[0])
    d.clip(pb[0])
    other = float(d.cmd("detect")[1].split("cos=")[1].split()[0])
    assert same > other            # the enrolled phrase is nearer its prototype than another phrase
    bias0 = d.app.head.bias[0]
    kind, text, _ = d.cmd("feedback 0")
    assert kind == L.ACK and "adapted" in text and d.app.head.bias[0] != bias0
    assert Driver(fs).app.replay_count == d.app.replay_count == 6   # 5 shots + the confirmed one, persisted
    kind, text, extra = d.cmd("update 4 9")
    assert kind == L.ACK, text
    from edge.portable.chunks import Reassembler
    rs = Reassembler()
    frames = [rs.add(p) for k, p in extra if k == L.UPDATE]
    frame = [f for f in frames if f is not None][0]
    upd = decode_update(frame, KEY, last_seq=8, round_id=4, model_version=d.app.version)
    got = np.array(upd.tensor("proto/bias").values)
    np.testing.assert_allclose(got, np.array(d.app.head.bias), atol=abs(bias0 - d.app.head.bias[0]) / 100 + 1e-6)
    tampered = bytearray(frame)
    tampered[40] ^= 1
    with pytest.raises(AuthError):
        decode_update(bytes(tampered), KEY)


def test_state_survives_a_restart(fs, clips):
    d = Driver(fs)
    enrol(d, "kw", list(clips.values())[0][:5])
    d2 = Driver(fs)
    assert d2.app.head.count == 1 and d2.app.names == ["kw"]
    assert "keywords=1" in d2.cmd("status")[1]


def test_resend_is_answered_not_applied_twice(fs, clips):
    d = Driver(fs)
    enrol(d, "kw", list(clips.values())[0][:5])
    d.clip(list(clips.values())[0][5])
    d.cmd("detect")
    d.seq += 1
    first = d.app.handle(L.CMD, d.seq, b"feedback 0")
    bias = d.app.head.bias[0]
    again = d.app.handle(L.CMD, d.seq, b"feedback 0")   # same seq: a resend after a lost ACK
    assert again == first and d.app.head.bias[0] == bias


def test_full_filesystem_is_reported_and_changes_nothing(fs, clips, monkeypatch):
    d = Driver(fs)
    before = (fs / "config.json").read_bytes()

    def full(path, data):
        raise OSError(28, "filesystem full writing %s" % path)

    monkeypatch.setattr("firmware.app.atomic_write", full)
    kind, text, _ = enrol(d, "kw", list(clips.values())[0][:5])
    assert kind == L.NAK and "could not save" in text and "free space" in text
    assert d.app.head.count == 0 and d.app.names == []
    assert (fs / "config.json").read_bytes() == before and not (fs / "state" / "head.bin").exists()


def test_bad_commands_get_a_reason(fs):
    d = Driver(fs)
    for cmd, why in (("fly", "unknown command"), ("shot", "no enrolment"), ("detect", "frames of audio"),
                     ("feedback 3", "feedback label"), ("update x", "ROUND [SEQ]"),
                     ("update 1", "nothing learned")):
        kind, text, _ = d.cmd(cmd)
        assert kind == L.NAK and why in text, (cmd, text)
    assert d.send(L.AUDIO, b"\x01\x02\x03")[0][0] == L.NAK


def _bundle_new(fs, mutate):
    import shutil
    shutil.copytree(fs / "bundle", fs / "bundle.new")
    desc = json.loads((fs / "bundle.new" / "bundle.json").read_text())
    mutate(fs / "bundle.new", desc)
    (fs / "bundle.new" / "bundle.json").write_text(json.dumps(desc))


@pytest.mark.parametrize("case,reason", [
    ("other-model", "model other"), ("older", "older than"), ("truncated", "does not match its digest")])
def test_bad_bundle_is_rejected_and_the_running_one_kept(fs, case, reason):
    def mutate(d, desc):
        if case == "other-model":
            desc["model_id"] = "other"
        elif case == "older":
            desc["version"] = -1
        else:
            raw = (d / "weights.elb").read_bytes()
            (d / "weights.elb").write_bytes(raw[:len(raw) // 2])   # a reset mid-transfer
    _bundle_new(fs, mutate)
    before = (fs / "bundle" / "weights.elb").read_bytes()
    d = Driver(fs)
    events = [p.decode() for k, p in d.cmd("status")[2] if k == L.EVENT]
    assert any("bundle rejected" in e and reason in e for e in events), events
    assert (fs / "bundle" / "weights.elb").read_bytes() == before and not (fs / "bundle.new").exists()


def test_newer_bundle_installs_and_keeps_the_old_one(fs):
    _bundle_new(fs, lambda d, desc: desc.update(version=desc["version"] + 1))
    d = Driver(fs)
    assert d.app.version == json.loads((fs / "bundle.old" / "bundle.json").read_text())["version"] + 1


def test_link_decoder_recovers_from_truncated_and_corrupt_frames():
    dec = L.Decoder()
    good = L.encode(L.CMD, 5, b"status")
    dec.feed(good[:9] + L.encode(L.CMD, 6, b"detect"))    # truncated frame, then a whole one
    with pytest.raises(L.LinkError):
        dec.next()
    assert dec.next() == (L.CMD, 6, b"detect")
    bad = bytearray(L.encode(L.AUDIO, 7, b"\x00\x01" * 10))
    bad[12] ^= 0x40
    dec.feed(b"\x00garbage" + bytes(bad) + good)
    with pytest.raises(L.LinkError, match="CRC"):
        dec.next()
    assert dec.next() == (L.CMD, 5, b"status")
    assert dec.next() is None
    buf = bytearray(64)
    n = L.encode_into(buf, L.ACK, 9, struct.pack("<H", 9) + b"ok")
    assert bytes(buf[:n]) == L.encode(L.ACK, 9, struct.pack("<H", 9) + b"ok")


def test_board_numbers_updates_and_signs_checkins(fs, clips):
    import hashlib
    import hmac
    d = Driver(fs)
    enrol(d, "kw", list(clips.values())[0][:5])
    kind, text, extra = d.cmd("update 3")
    assert kind == L.ACK and text.endswith("seq=1"), text
    first = b"".join(p for k, p in extra if k == L.UPDATE)
    assert Driver(fs).cmd("update 3")[1].endswith("seq=2")          # persisted across a restart
    kind, text, again = d.cmd("update 3 1")                          # a repeat: same bytes
    assert text.endswith("seq=1") and b"".join(p for k, p in again if k == L.UPDATE) == first
    assert Driver(fs).cmd("update 4")[1].endswith("seq=3")          # a repeat does not rewind
    kind, text, _ = d.cmd("checkin wifi")
    mac, body = text.split("mac=")[1].split()[0], text.split(" body=", 1)[1]
    assert hmac.new(KEY, body.encode(), hashlib.sha256).hexdigest() == mac
    state = json.loads(body)
    assert state["device_id"] == "esp32-test" and state["tier"] == "mcu" and state["network"] == "wifi"


def test_fake_microphone_reads_a_wav_and_refuses_other_formats(tmp_path):
    import array
    from edge.audio import write_wav
    pcm = (np.arange(1000) % 300 - 150).astype(np.int16)
    write_wav(tmp_path / "ok.wav", pcm)
    b = FakeBoard(wav=tmp_path / "ok.wav")
    buf = array.array("h", bytes(640))
    got = []
    while n := b.read_audio(memoryview(buf).cast("B")):
        got.extend(buf[:n // 2])
    assert got == pcm.tolist()
    write_wav(tmp_path / "8k.wav", pcm, rate=8000)
    with pytest.raises(ValueError, match="8000 Hz.*16 kHz mono"):
        FakeBoard(wav=tmp_path / "8k.wav")
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00")
    with pytest.raises(ValueError, match="not a WAV"):
        FakeBoard(wav=tmp_path / "junk.wav")
