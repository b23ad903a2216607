"""edge.atomic's writers: old or new file, never a mix; 0600 temps; public files under the umask."""

from __future__ import annotations

import io
import os
import stat

import numpy as np
import pytest

from edge import atomic


def _mode(p):
    return stat.S_IMODE(p.stat().st_mode)


def test_atomic_write_file_and_path_leave_no_temp_and_keep_the_old_file_on_error(tmp_path):
    p = tmp_path / "a.bin"
    atomic.atomic_write(p, b"one")
    assert p.read_bytes() == b"one" and _mode(p) == 0o600
    with pytest.raises(RuntimeError), atomic.atomic_file(p) as f:
        f.write(b"half")
        raise RuntimeError("writer died")
    assert p.read_bytes() == b"one"
    q = tmp_path / "m.onnx"
    with atomic.atomic_path(q) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".onnx") and _mode(tmp) == 0o600
        assert atomic.is_temp(tmp.name)
        tmp.write_bytes(b"model")
    assert q.read_bytes() == b"model"
    with pytest.raises(RuntimeError), atomic.atomic_path(q) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("tool failed")
    assert q.read_bytes() == b"model"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.bin", "m.onnx"]


def test_public_files_take_the_umask_mode_and_their_temps_are_0600(tmp_path):
    old = os.umask(0o027)
    try:
        seen = []
        p = tmp_path / "clip.wav"
        with atomic.atomic_file(p, mode=None) as f:
            seen.append(stat.S_IMODE(os.fstat(f.fileno()).st_mode))
            f.write(b"RIFF")
        assert seen == [0o600] and _mode(p) == 0o640
        q = tmp_path / "h.onnx"
        with atomic.atomic_path(q, mode=None) as tmp:
            tmp.write_bytes(b"x")
        assert _mode(q) == 0o640
    finally:
        os.umask(old)


def test_npz_bytes_round_trips_and_write_new_refuses_an_existing_file(tmp_path):
    arrays = {"a": np.arange(3, dtype=np.float32), "b": np.eye(2)}
    z = np.load(io.BytesIO(atomic.npz_bytes(arrays)))
    assert set(z.files) == {"a", "b"} and all(np.array_equal(z[k], v) for k, v in arrays.items())
    k = tmp_path / "k.key"
    atomic.write_new(k, b"secret", 0o600)
    assert k.read_bytes() == b"secret" and _mode(k) == 0o600
    with pytest.raises(FileExistsError):
        atomic.write_new(k, b"other", 0o600)
    assert k.read_bytes() == b"secret"


def test_replace_dir_swaps_a_directory_in(tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "new"
    out.mkdir()
    (out / "old.txt").write_text("old")
    tmp.mkdir()
    (tmp / "new.txt").write_text("new")
    atomic.replace_dir(tmp, out)
    assert [p.name for p in out.iterdir()] == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
