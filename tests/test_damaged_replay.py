"""A damaged tail replay buffer (QA pass 3: `detect`, `device run` and even `status` stopped with
"replay file ... is damaged" until a person deleted it). The buffer only holds examples to
rehearse: a command that only adds to it keeps it beside as ``replay_tail.bin.damaged`` with one
warning and starts an empty one; `status` reports the damage instead of failing; `adapt`, which
trains on it, still refuses it in one sentence."""

from __future__ import annotations

import numpy as np

from devstate_helpers import make_keyword_clips
from edge.audio import read_wav
from edge.device import Device
from edge.replay import TAIL_REPLAY, load_replay


def test_detect_sets_a_damaged_replay_buffer_aside_and_status_reports_it(tmp_path, capsys):
    c = make_keyword_clips(tmp_path / "kw", n=5)
    st = tmp_path / "st"
    dev = Device(st)
    dev.enroll("buzz word", c[:4])
    stream = np.concatenate([np.zeros(8000, np.int16), read_wav(c[4]), np.zeros(16000, np.int16)])
    list(dev.detect(stream))
    assert load_replay(st / TAIL_REPLAY) is not None
    junk = bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))
    (st / TAIL_REPLAY).write_bytes(junk)
    rep = dev.status()["replay"][TAIL_REPLAY]
    assert "is damaged" in rep["damaged"] and "delete the file" in rep["fix"]  # status used to raise
    assert [e["keyword"] for e in dev.detect(stream)] == ["buzz word"]  # used to raise
    assert (st / (TAIL_REPLAY + ".damaged")).read_bytes() == junk
    assert load_replay(st / TAIL_REPLAY).count == 0
    err = capsys.readouterr().err
    assert err.count("is damaged") == 1 and "kept as replay_tail.bin.damaged" in err, err
    assert "damaged" not in dev.status()["replay"][TAIL_REPLAY]
