"""Host commands (QA pass 3): ``partition`` for a MicroPython target writes a bundle ``flash`` takes or
refuses in one sentence; ``quantize``'s stdout is its JSON; plain numbers in ``serve``'s 400s;
``bundle inspect`` verifies with the default keys; a refused ``fleet --ray`` leaves ``--out`` alone;
``report`` fails when it cannot write its chart; ``serve --help`` names no checkout path."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from bundle_key_helpers import MCU, _default_keys, needs_mcu  # noqa: F401 (an autouse fixture)
from edge.cli import main as cli
from edge.kws import DEFAULT_BUNDLE
from host.keys import generate_keypair



def _one_sentence(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# -- 4. partition for a MicroPython target ----------------------------------------------------------------

def test_partition_refuses_a_model_the_board_cannot_run_even_with_force(tmp_path, capsys):
    priv, _ = generate_keypair(tmp_path / "keys")
    out = tmp_path / "b"
    rc = cli(["partition", "kws-dscnn-s", "--target", "esp32", "--out", str(out), "--key", str(priv), "--force"])
    err = _one_sentence(capsys.readouterr().err)
    assert rc == 2 and not out.exists()
    assert "too slow" in err and "MEAN" in err and "edgelearn partition kws-mcu-tcnn --target esp32" in err
    assert "DS-CNN variant" not in err  # which needs MEAN too, and which nothing installed builds


def test_a_model_too_slow_for_a_micropython_board_is_pointed_at_the_shipped_mcu_model(tmp_path, capsys):
    priv, _ = generate_keypair(tmp_path / "keys")
    rc = cli(["partition", "kws-dscnn-s", "--target", "esp32", "--out", str(tmp_path / "b"), "--key", str(priv)])
    err = _one_sentence(capsys.readouterr().err)
    assert rc == 2 and "too slow" in err and "kws-mcu-tcnn" in err and "DS-CNN variant" not in err


@needs_mcu
def test_partition_writes_the_graph_the_board_runs(tmp_path, capsys):
    """From the MCU model file alone the bundle carries graph.json (what the shipped bundle carries),
    so the board's deploy list has everything it needs."""
    from host.board.manifest import bundle_files

    priv, _ = generate_keypair(tmp_path / "keys")
    labels = ",".join(json.loads((MCU / "manifest.json").read_text())["labels"])
    out = tmp_path / "b"
    assert cli(["partition", str(MCU / "mcu_int8.tflite"), "--target", "esp32", "--out", str(out),
                "--key", str(priv), "--labels", labels]) == 0, capsys.readouterr().err
    assert (out / "graph.json").read_bytes() == (MCU / "graph.json").read_bytes()
    m = json.loads((out / "manifest.json").read_text())
    blob = next(p for p in m["partitions"] if p["format"] == "mpy-blob")
    assert blob["graph"] == "graph.json" and "graph.json" in m["files"]
    m["frontend"] = json.loads((MCU / "manifest.json").read_text())["frontend"]  # a bare model has none
    (out / "manifest.json").write_text(json.dumps(m))
    names = [dest for _src, dest in bundle_files(out, tmp_path / "deploy")]
    assert names == ["bundle.new/weights.elb", "bundle.new/graph.json", "bundle.new/bundle.json"]


def _micropython():
    try:
        from host.board.unixport import micropython_exe
        return micropython_exe()
    except Exception:  # noqa: BLE001 (no rig: skip)
        return None


@needs_mcu
@pytest.mark.skipif(_micropython() is None, reason="MicroPython unix port missing")
def test_partitioned_mcu_bundle_flashes_and_a_tampered_one_does_not(tmp_path, capsys):
    priv, pub = generate_keypair(tmp_path / "keys")
    out = tmp_path / "b"
    assert cli(["partition", "kws-mcu-tcnn", "--target", "esp32", "--out", str(out), "--key", str(priv)]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    raw = bytearray((bad / "weights.elb").read_bytes())
    raw[-1] ^= 1
    (bad / "weights.elb").write_bytes(bytes(raw))
    assert cli(["flash", "--port", "pty", "--fs", str(tmp_path / "board0"), "--bundle", str(bad),
                "--pubkey", str(pub)]) == 2
    assert "SHA-256 mismatch" in _one_sentence(capsys.readouterr().err)
    assert cli(["flash", "--port", "pty", "--fs", str(tmp_path / "board"), "--bundle", str(out),
                "--pubkey", str(pub)]) == 0
    assert "EVENT bundle installed: kws-mcu-tcnn" in capsys.readouterr().out


# -- 5. quantize: stdout is the JSON ---------------------------------------------------------------------

def test_quantize_stdout_is_only_its_json(tmp_path, capfd, monkeypatch):
    import host.commands.quantize as qc

    def noisy(model_dir, out_dir, max_drop=1.0):
        print("Saved artifact at '/tmp/x'. The following endpoints are available:")  # as the Keras export does
        os.write(1, b"C-level converter output\n")
        return {"metrics": {"int8_accuracy": 0.9}}

    monkeypatch.setattr(qc, "quantize", noisy)
    assert cli(["quantize", "--model", str(tmp_path)]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == {"int8_accuracy": 0.9}
    assert "Saved artifact" in err and "C-level converter output" in err


# -- 6. the small ones -------------------------------------------------------------------------------------

@pytest.mark.parametrize("values,dt", [([1.0, 1e39], "FP32"), ([1.5], "INT8"), ([2], "BOOL")])
def test_serve_400_shows_numbers_as_sent(values, dt):
    from host.serve.protocol import ProtocolError, _cast

    with pytest.raises(ProtocolError) as e:
        _cast(np.asarray(values), dt, "x")
    assert "np." not in str(e.value) and repr(values[-1]) in str(e.value)


def test_inspect_verifies_with_the_default_trusted_keys(capsys):
    from host.bundle import summary

    assert summary(DEFAULT_BUNDLE)["signature"]["verified"] is True
    assert cli(["bundle", "inspect", "kws-dscnn-s"]) == 0
    out = capsys.readouterr().out
    assert "verified with the default trusted keys" in out and "NOT verified" not in out


def test_inspect_says_why_an_untrusted_signature_is_not_verified(tmp_path, capsys):
    from host.bundle import sign_bundle

    priv, _ = generate_keypair(tmp_path / "keys")
    d = tmp_path / "b"
    shutil.copytree(DEFAULT_BUNDLE, d)
    sign_bundle(d, priv)
    assert cli(["bundle", "inspect", str(d)]) == 0
    assert "NOT verified (manifest.sig: signed by key" in capsys.readouterr().out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_fleet_ray_does_not_create_out(tmp_path, capsys):
    pytest.importorskip("ray")
    out = tmp_path / "fleet"
    rc = cli(["fleet", "simulate", "--ray", f"127.0.0.1:{_closed_port()}", "--devices", "4", "--rounds", "1",
              "--clients-per-round", "2", "--out", str(out)])
    assert rc == 2 and "no Ray cluster answers" in _one_sentence(capsys.readouterr().err)
    assert not out.exists()


@needs_mcu
def test_report_fails_when_it_cannot_write_the_chart(tmp_path, capsys):
    rc = cli(["report", "kws-mcu-tcnn", "--target", "esp32", "--chart", str(tmp_path / "nodir" / "x.png")])
    err = _one_sentence(capsys.readouterr().err)
    assert rc == 2 and "cannot write the chart" in err and "nodir" in err


def test_serve_help_says_the_shipped_keys_are_always_added(capsys):
    with pytest.raises(SystemExit):
        cli(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "models/keys" not in out and "shipped release keys are always added" in out
