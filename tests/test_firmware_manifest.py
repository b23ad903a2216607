"""The deploy manifest (host/board/manifest.py) and the freeze manifest (host/board/manifest_freeze.py) agree."""

from __future__ import annotations

from pathlib import Path

from host.board import manifest

FREEZE = Path(manifest.__file__).with_name("manifest_freeze.py")


def test_freeze_manifest_lists_the_deployed_modules_and_they_exist():
    calls = []
    env = {"include": lambda p: calls.append(("include", p)),
           "package": lambda name, files=None, base_path=".", opt=None: calls.append(("package", name, files, base_path)),
           "module": lambda *a, **k: calls.append(("module", a))}
    exec(compile(FREEZE.read_text(), "manifest_freeze.py", "exec"), env)
    assert env["PORTABLE"] == manifest.PORTABLE and env["FIRMWARE"] == manifest.FIRMWARE
    assert calls[0] == ("include", "$(PORT_DIR)/boards/manifest.py")
    for _, name, files, base in [c for c in calls if c[0] == "package"]:
        for f in files:
            assert (FREEZE.parent / base / name / f).is_file(), f
    frozen = {f"{name}/{f}" for _, name, files, _ in [c for c in calls if c[0] == "package"] for f in files}
    deployed = {f"edge/portable/{n}.py" for n in manifest.PORTABLE} | {f"firmware/{n}.py" for n in manifest.FIRMWARE}
    assert deployed <= frozen


def test_sender_modules_private_constants_equal_the_public_ones():
    # A board loads only the sender's half of the wire codec and the chunker, whose format
    # constants are private const()s (no names interned on the board); the public names live
    # in edge.portable.wire and edge.portable.chunks_rx. Both must say the same.
    from edge.portable import chunks, chunks_rx, wire, wire_encode
    pairs = [(wire, wire_encode, n) for n in (
        "VERSION", "HEADER_LEN", "TAG_LEN", "MAX_FRAME_LEN", "MAX_ELEMENTS", "MAX_TENSORS", "MAX_NDIM",
        "MAX_NAME_LEN", "MAX_DEVICE_ID_LEN", "MAX_META", "MAX_META_KEY_LEN", "MAX_META_STR_LEN", "DENSE_F32",
        "TOPK_INT8", "KNOWN_FLAGS", "META_INT", "META_FLOAT", "META_STR")]
    pairs += [(chunks_rx, chunks, n) for n in (
        "CHUNK_MAGIC", "CHUNK_VERSION", "CHUNK_FMT", "CHUNK_HEADER_LEN", "CHUNK_OVERHEAD", "MAX_CHUNKS",
        "MAX_CHUNK_PAYLOAD")]
    for public, private, name in pairs:
        assert getattr(public, name) == getattr(private, "_" + name), name
    assert wire.INT8 is wire_encode.INT8 and set(wire.CODEC_NAMES) == {wire.DENSE_F32, wire.INT8, wire.TOPK_INT8}
    assert chunks_rx.CHUNK_OVERHEAD == chunks_rx.CHUNK_HEADER_LEN + chunks_rx.CHUNK_CRC_LEN
    import inspect
    src = inspect.getsource(wire_encode)
    assert f'"{wire.HEADER_FMT}"' in src and 'b"%s"' % wire.MAGIC.decode() in src   # written out in write_update
    # the receiver's halves are still reachable from the sender modules
    assert chunks.Reassembler is chunks_rx.Reassembler and chunks.CHUNK_OVERHEAD == 28
    from edge.portable import wire_errors, wire_errors_rx
    assert wire_errors.AuthError is wire_errors_rx.AuthError is wire.AuthError
