"""Host commands: Ctrl-C stops promptly, bad options are one sentence before any work, serve says
where it listens, a partitioned bundle keeps what it does not replace, the shipped bundle is the default."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for espeak-ng, Festival and Flite: each call counts itself in $FAKE_SYNTH_LOG, waits a
# little (a real render takes a while) and writes a short tone as the WAV the caller asked for.
FAKE_SYNTH = r'''#!{python}
import math, os, re, struct, sys, time
def wav():
    pcm = b"".join(struct.pack("<h", int(8000 * math.sin(i / 8))) for i in range(4000))
    return (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000,
            32000, 2, 16) + b"data" + struct.pack("<I", len(pcm)) + pcm)
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["FAKE_SYNTH_LOG"], "a") as f:
    f.write(name + "\n")
time.sleep(0.05)
if name == "espeak-ng":
    sys.stdout.buffer.write(wav())
elif name == "flite":
    open(args[args.index("-o") + 1], "wb").write(wav())
elif name == "festival":
    for path in re.findall(r'"([^"]+\.wav)"', open(args[-1]).read()):
        open(path, "wb").write(wav())
'''


def edgelearn(*args, env=None, cwd=None, timeout=300):
    env = env or dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's code, from any directory
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def one_sentence(res, *words):
    """A one-line user error (exit 2, no traceback) that names every one of ``words``."""
    err = res.stderr.strip()
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


# --- 1. Ctrl-C during corpus rendering ------------------------------------------------------------

def fake_synths(tmp_path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("espeak-ng", "festival", "flite"):
        p = bin_dir / name
        p.write_text(FAKE_SYNTH.replace("{python}", sys.executable))
        p.chmod(0o755)
    log = tmp_path / "renders.log"
    log.write_text("")
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_SYNTH_LOG=str(log),
                EDGELEARN_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))


def test_ctrl_c_during_corpus_rendering_cancels_the_queued_renders(tmp_path):
    """SIGINT to `edgelearn data synth` (as `timeout -s INT` sends it: to the command alone) ends it
    with the queued voices cancelled: far fewer synthesizer runs than the corpus has queued."""
    from host.data import synth
    from host.data.corpus import CorpusConfig, _jobs_for

    import numpy as np

    cfg = CorpusConfig()
    voices = synth.all_voices()
    queued = sum(1 if v.synth == "festival" else len(_jobs_for(v, cfg, np.random.default_rng(0)))
                 for v in voices)  # synthesizer processes the whole corpus would start
    env = fake_synths(tmp_path)
    log = tmp_path / "renders.log"
    proc = subprocess.Popen([sys.executable, "-m", "edge.cli", "data", "synth", "--force"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until rendering is under way (a guard against a hang, not a timing)
            if len(log.read_text().splitlines()) >= 20 or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        started = len(log.read_text().splitlines())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = len(log.read_text().splitlines())
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().endswith("interrupted"), err  # no progress after it
    # at most the renders already running (two workers) finish or are killed after the signal
    assert done <= started + 4 < queued // 10, (started, done, queued)
    assert not list((tmp_path / "cache").glob("corpus-*/audio.npy"))  # nothing half-made was saved


# --- 2, 6. edgelearn serve ------------------------------------------------------------------------

def test_serve_refuses_a_port_out_of_range_in_one_sentence(tmp_path):
    res = edgelearn("serve", "--port", "99999", cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "1 to 65535" in res.stderr.strip().splitlines()[-1], res.stderr


def test_serve_says_a_port_in_use_in_one_sentence(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = edgelearn("serve", "--port", str(port), cwd=tmp_path, timeout=120)
    one_sentence(res, str(port), "already in use", "--port")


def test_serve_names_where_it_listens_and_ctrl_c_stops_it_quietly(tmp_path):
    """The shipped bundle by the docs' name from a directory without models/ (as a wheel user has);
    one `serving ... on http://...` line; Ctrl-C to the process group (a terminal's) stops the
    server and its replica processes with no traceback."""
    import httpx

    from host.netutil import free_port

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "edge.cli", "serve", "--bundle", "models/kws-dscnn-s",
                             "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert f"on http://127.0.0.1:{port}" in line and "kws-dscnn-s" in line, line + proc.stderr.read()
        for _ in range(600):  # until the replicas are up (a guard against a hang, not a timing)
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/v2/models/kws-dscnn-s", timeout=5).status_code == 200
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    with socket.socket() as s:  # nothing is left listening on the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


# --- 3. a partitioned shipped bundle is still a bundle spot runs -----------------------------------

def test_partitioned_shipped_bundle_keeps_its_manifest_and_runs_spot(tmp_path):
    import numpy as np

    from edge.audio import write_wav
    from edge.cli import main
    from edge.kws import DEFAULT_BUNDLE
    from edge.spot import classify
    from host.keys import generate_keypair

    priv, pub = generate_keypair(tmp_path / "keys")
    out = tmp_path / "part-rpi4"
    assert main(["partition", str(DEFAULT_BUNDLE), "--target", "rpi4", "--out", str(out), "--key", str(priv)]) == 0
    shipped = json.loads((DEFAULT_BUNDLE / "manifest.json").read_text())
    m = json.loads((out / "manifest.json").read_text())
    assert (m["model_id"], m["version"], m["labels"]) == (shipped["model_id"], shipped["version"], shipped["labels"])
    assert m["frontend"] == shipped["frontend"] and m["target"]["name"] == "rpi4"
    assert set(m["files"]) == set(shipped["files"])  # the tail, negatives, card and other models came along
    for key in ("operating", "negatives", "labels12"):
        assert m["extra"][key] == shipped["extra"][key]
    assert m["trainable"]["tail"] == shipped["trainable"]["tail"] and "plan" in m["extra"]
    t = np.arange(16000) / 16000
    write_wav(tmp_path / "x.wav", (3000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16))
    got = list(classify([tmp_path / "x.wav"], out, trusted_keys=pub))
    want = list(classify([tmp_path / "x.wav"], DEFAULT_BUNDLE))
    assert [(g[1], round(g[2], 3)) for g in got] == [(w[1], round(w[2], 3)) for w in want]
    # an explicit --model-id/--version still wins
    assert main(["partition", str(DEFAULT_BUNDLE), "--target", "rpi4", "--out", str(tmp_path / "p2"),
                 "--key", str(priv), "--model-id", "mine", "--version", "7"]) == 0
    m2 = json.loads((tmp_path / "p2" / "manifest.json").read_text())
    assert (m2["model_id"], m2["version"]) == ("mine", 7)


# --- 4, 5, 7. bad options are one sentence, before any work ---------------------------------------

@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """An empty corpus cache, and rendering that fails the test: a check that comes after work started
    shows as that failure, not as a long run."""
    from host.data import corpus, synth

    def started(*a, **k):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setenv("EDGELEARN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "render_all", started)
    monkeypatch.setattr(synth, "render_jobs", started)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kitchen.wav").write_bytes(b"RIFF")
    return tmp_path


def said(capsys, rc, *words):
    """main()'s answer is exit 2 and one line on stderr naming every one of ``words``."""
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("model, words", [("nope", ["nope", "does not exist", "edgelearn train"]),
                                          ("empty", ["empty", "model.keras", "edgelearn train"]),
                                          ("kitchen.wav", ["kitchen.wav", "not a training output", "edgelearn train"])])
def test_quantize_names_what_model_it_wants(no_work, capsys, model, words):
    from edge.cli import main

    (no_work / "empty").mkdir()
    said(capsys, main(["quantize", "--model", model]), *words)
    assert (no_work / "kitchen.wav").read_bytes() == b"RIFF"


@pytest.mark.parametrize("argv, words", [
    (["fleet", "simulate", "--devices", "0", "--rounds", "1", "--out", "fl0"], ["--devices 0"]),
    (["fleet", "simulate", "--devices", "2", "--rounds", "-1", "--out", "fl1"], ["--rounds -1"]),
    (["fleet", "simulate", "--clients-per-round", "0", "--out", "fl2"], ["--clients-per-round"]),
    (["fleet", "simulate", "--out", "kitchen.wav"], ["kitchen.wav", "is a file"]),
    (["train", "--out", "tr", "--synths", "foo"], ["--synths", "foo", "espeak"]),
    (["train", "--out", "tr", "--epochs", "0"], ["--epochs 0"]),
    (["export", "esphome", "--keyword", "hey robot", "--wav", "a.wav", "b.wav", "c.wav", "d.wav", "e.wav",
      "--out", "kitchen.wav"], ["kitchen.wav", "not a folder"]),
    (["export", "esphome", "--keyword", "hey robot", "--wav", "a.wav", "b.wav", "c.wav", "d.wav", "e.wav",
      "--out", "esp", "--epochs", "-1"], ["--epochs -1"]),
    (["aggregator", "init", "--state", "agg", "--clients-per-round", "0"], ["--clients-per-round", "--help"]),
    (["export", "esphome", "--keyword", "hey robot", "--wav", "a.wav", "b.wav", "c.wav", "d.wav", "e.wav",
      "--out", "esp", "--website", "notaurl"], ["--website notaurl", "https://"]),
])
def test_bad_options_are_refused_before_any_work(no_work, capsys, argv, words):
    from edge.cli import main

    err = said(capsys, main(argv), *words)
    assert "config.json" not in err
    assert not (no_work / "cache").exists() and not (no_work / "agg").exists()
    assert not any((no_work / d).exists() for d in ("fl0", "fl1", "fl2", "tr", "esp"))
    assert (no_work / "kitchen.wav").read_bytes() == b"RIFF"  # nothing already there is touched


def test_export_wav_takes_several_files_after_one_flag():
    import argparse

    from host.commands.export import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["esphome", "--keyword", "hey", "--wav", "a.wav", "b.wav", "--wav", "c.wav", "--out", "o"])
    assert [w.name for w in args.wav] == ["a.wav", "b.wav", "c.wav"]


# --- 6. the shipped bundle by default -------------------------------------------------------------

def test_bundle_verify_trusts_the_shipped_key_by_default(tmp_path):
    res = edgelearn("bundle", "verify", "kws-dscnn-s", cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("OK kws-dscnn-s"), res.stdout + res.stderr


def test_report_writes_its_chart_in_the_current_directory(tmp_path):
    from edge.kws import DEFAULT_BUNDLE

    before = sorted(p.name for p in DEFAULT_BUNDLE.parent.iterdir())
    res = edgelearn("report", str(DEFAULT_BUNDLE), "--target", "rpi4", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "kws-dscnn-s.rpi4.memory.png").is_file()
    assert "chart: kws-dscnn-s.rpi4.memory.png" in res.stdout
    assert sorted(p.name for p in DEFAULT_BUNDLE.parent.iterdir()) == before


def test_export_refuses_an_out_folder_it_cannot_write_before_training(no_work, capsys, monkeypatch):
    """A read-only folder (QA: a read-only mount, found after 135 s of training): refused first. The
    suite runs as root, which writes through any mode, so the folder's answer is given to the check."""
    from edge.cli import main
    from host.commands import export

    ro = no_work / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(export.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    said(capsys, main(["export", "esphome", "--keyword", "hey robot", "--wav", "a.wav", "b.wav", "c.wav",
                       "d.wav", "e.wav", "--out", str(ro / "esp")]), "not writable")
    assert not (ro / "esp").exists()
