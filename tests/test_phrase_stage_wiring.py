"""The phrase second stage's wiring (edge/phrase_stage.py through edge/device_detect.py, the CLI and the
agent): ``second_stage``'s refusals, a bundle without phrase models, a missing front end, ``--phrase``
on the command line, in Wyoming and in the agent's systemd unit. The stage itself, the shipped models
and the Detector holding candidates for it: tests/test_phrase_stage.py, whose fixtures these share."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_phrase_stage import CLI, ROOT, SR, _said, _stream, bundle, renders, stage_ok  # noqa: F401 (fixtures)

from edge.detect import detect_pcm
from edge.errors import EdgelearnError
from edge.kws import DEFAULT_BUNDLE
from edge.phrase_stage import PhraseConfirm

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                reason="models/kws-dscnn-s not built yet (make model)")


# -- 4. second_stage ------------------------------------------------------------------------------

def strip_phrase_stage(tmp, models_to=None):
    """(bundle directory, private key, the removed ``extra.phrase_stage``): a copy of the shipped bundle
    in ``tmp`` without its phrase models or ``extra.phrase_stage``, signed with a throwaway key whose
    .pub is beside it; ``models_to``: the models moved there as ``<command>.tflite``,
    ``<command>_1.tflite``... (else deleted)."""
    from host.bundle import sign_bundle
    from host.keys import generate_keypair

    priv, _ = generate_keypair(tmp / "keys", "throwaway")
    b = tmp / "kws-bare"
    shutil.copytree(DEFAULT_BUNDLE, b)
    (b / "manifest.sig").unlink()
    m = json.loads((b / "manifest.json").read_text())
    cfg = m["extra"].pop("phrase_stage")
    (b / "manifest.json").write_text(json.dumps(m))
    for c, names in cfg["models"].items():
        for i, f in enumerate(names):
            if models_to is None:
                (b / f).unlink()
            else:
                shutil.move(b / f, models_to / f"{c}{'_%d' % i if i else ''}.tflite")
    sign_bundle(b, priv, refresh=True)
    return b, priv, cfg


@pytest.fixture(scope="module")
def bare_bundle(tmp_path_factory):
    """The shipped bundle without its phrase models or extra.phrase_stage, signed with a throwaway key."""
    from edge.bundle import load_bundle

    b, priv, _ = strip_phrase_stage(tmp_path_factory.mktemp("bare"))
    return load_bundle(b, trusted_keys=priv.with_suffix(".pub"))


def _one_sentence(e: EdgelearnError) -> str:
    msg = str(e)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_second_stage_names_each_stage_and_refuses_others_in_one_sentence(bundle, stage_ok):
    from edge.device_detect import second_stage

    assert second_stage(False, bundle) is None and second_stage(None, bundle) is None
    stage = second_stage("phrase", bundle)
    assert isinstance(stage, PhraseConfirm) and stage.first_stage == 0.2
    for bad in ("nonsense", "Phrase", 1.5):
        with pytest.raises(EdgelearnError) as e:
            second_stage(bad, bundle)
        msg = _one_sentence(e.value)
        assert repr(bad) in msg and "not a second stage" in msg and "'phrase'" in e.value.fix


def test_a_bundle_without_phrase_models_is_one_sentence_naming_it(bare_bundle, tmp_path, stage_ok):
    import edge
    from edge.device_detect import second_stage
    from edge.phrase_stage import config

    assert "phrase_stage" not in bare_bundle.manifest["extra"]
    for call in (lambda: config(bare_bundle), lambda: PhraseConfirm(bare_bundle),
                 lambda: second_stage("phrase", bare_bundle),
                 lambda: edge.Device(tmp_path / "st", bare_bundle).detector(asr="phrase", replay=False)):
        with pytest.raises(EdgelearnError) as e:
            call()
        msg = _one_sentence(e.value)
        assert f"bundle {bare_bundle.model_id} v{bare_bundle.version} has no phrase models" in msg, msg
        assert "--no-phrase" in e.value.fix
    # the same bundle detects as before without the stage
    det, _ = edge.Device(tmp_path / "st", bare_bundle).detector(replay=False)
    assert det.asr is None


def test_the_wyoming_server_refuses_a_bundle_without_phrase_models_when_built(bare_bundle, tmp_path, stage_ok):
    pytest.importorskip("wyoming")
    import edge
    from edge.wyoming import WakeServer

    with pytest.raises(EdgelearnError) as e:
        WakeServer(edge.Device(tmp_path / "st", bare_bundle), "tcp://127.0.0.1:0", asr="phrase")
    assert "has no phrase models" in _one_sentence(e.value)


def test_the_wyoming_server_confirms_with_the_phrase_stage(bundle, renders, tmp_path):
    """``edgelearn wyoming --phrase``: the server's shared models hold base keywords for the phrase
    stage, stream by stream, in 1,024-sample chunks as Home Assistant sends them."""
    pytest.importorskip("wyoming")
    import edge
    from edge.wyoming import WakeServer

    texts = ["yes", "nobody knows", "stop", "download"]
    pcm, spans = _stream(texts, "en-us+m1")
    ms = WakeServer(edge.Device(tmp_path / "st"), "tcp://127.0.0.1:0", asr="phrase").model_set(None)
    for _ in range(2):  # two streams through one model set
        det, out = ms.detector(), []
        for i in range(0, len(pcm), 1024):
            out += ms.push(det, pcm[i:i + 1024])
        assert _said(out + ms.flush(det), texts, spans) == [("yes", "yes"), ("stop", "stop")]


def test_without_pymicro_features_the_stage_is_one_sentence_before_any_model_loads(bundle, monkeypatch):
    from edge import phrase_stage
    from edge.device_detect import second_stage

    monkeypatch.setitem(sys.modules, "pymicro_features", None)
    assert not phrase_stage.available()
    for call in (phrase_stage.require, lambda: phrase_stage.PhraseConfirm(bundle),
                 lambda: second_stage("phrase", bundle)):
        with pytest.raises(EdgelearnError) as e:
            call()
        assert "pymicro-features" in _one_sentence(e.value) and "edgelearn[phrase]" in e.value.fix


# -- 5. the command line -----------------------------------------------------------------------------

def _cli(*args, env=None, cwd=ROOT):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_device_detect_phrase_prints_json_events(bundle, renders, tmp_path):
    """Two commands and two words that start like one (en-us+m1): the shipped model's own operating
    point also fires on "nobody knows" (no) and "download" (down); with --phrase only the commands stay."""
    import edge
    from edge.audio import write_wav

    texts = ["yes", "nobody knows", "stop", "download"]
    pcm, spans = _stream(texts, "en-us+m1")
    wav = tmp_path / "s.wav"
    write_wav(wav, pcm)
    r = _cli("device", "detect", "--state", str(tmp_path / "st"), "--wav", str(wav), "--phrase", "--json",
             "--no-replay")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert _said(events, texts, spans) == [("yes", "yes"), ("stop", "stop")], r.stdout
    assert all(set(e) == {"keyword", "time_s", "score"} and e["score"] >= 0.2 for e in events)
    # the same as Device.detect(asr="phrase"); without the stage the same stream gives more
    assert list(edge.Device(tmp_path / "st2").detect(str(wav), replay=False, asr="phrase")) == events
    plain = list(edge.Device(tmp_path / "st2").detect(str(wav), replay=False, asr=False))
    assert len(plain) > len(events) and {(e["keyword"], e["time_s"]) for e in events} <= \
        {(e["keyword"], e["time_s"]) for e in plain}


def test_phrase_and_asr_together_are_argparses_one_line_error(tmp_path):
    for cmd in (["device", "detect", "--state", str(tmp_path / "st"), "--wav", "x.wav"],
                ["device", "run", "--state", str(tmp_path / "st"), "--print-unit"],
                ["wyoming", "--state", str(tmp_path / "st")]):
        r = _cli(*cmd, "--phrase", "--asr")
        assert r.returncode == 2, (cmd, r.stderr)
        last = r.stderr.strip().splitlines()[-1]
        assert "not allowed with argument" in last and "--phrase" in last and "--asr" in last, last
        assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.fixture()
def no_front_end(tmp_path):
    """An environment whose Python cannot import pymicro_features (an ImportError, as when it is not
    installed or its C extension does not load)."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "pymicro_features.py").write_text("raise ImportError('No module named pymicro_features')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                   else []))
    check = subprocess.run([sys.executable, "-c", "import edge.phrase_stage as p; print(p.available())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.stdout.strip() == "False", check.stderr
    return env


def test_without_pymicro_features_the_cli_says_which_extra_in_one_line(tmp_path, no_front_end):
    from edge.audio import write_wav

    wav = tmp_path / "x.wav"
    write_wav(wav, np.zeros(SR, np.int16))
    for cmd in (["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(wav), "--phrase", "--json"],
                ["device", "run", "--state", str(tmp_path / "st"), "--wav", str(wav), "--phrase", "--no-adapt"]):
        r = _cli(*cmd, env=no_front_end, cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "edgelearn[phrase]" in lines[0] and "pymicro-features" in lines[0], r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_without_pymicro_features_the_wyoming_server_says_so_before_serving(tmp_path, no_front_end):
    pytest.importorskip("wyoming")
    r = _cli("wyoming", "--state", str(tmp_path / "st"), "--uri", "tcp://127.0.0.1:0", "--phrase",
             env=no_front_end, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "edgelearn[phrase]" in lines[0], r.stderr


# -- 6. the agent's unit ---------------------------------------------------------------------------------

def test_the_agents_unit_carries_phrase(tmp_path):
    from edge.agent import AgentConfig, service_unit
    from edge.agent_unit import unit_options

    assert "--phrase" in unit_options(AgentConfig(asr="phrase"))
    assert "--asr" not in unit_options(AgentConfig(asr="phrase"))
    assert "--asr" in unit_options(AgentConfig(asr=True)) and "--phrase" not in unit_options(AgentConfig(asr=True))
    assert not {"--asr", "--phrase"} & set(unit_options(AgentConfig()))
    unit = service_unit(tmp_path, AgentConfig(asr="phrase"), exe="edgelearn")
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "--phrase" in shlex.split(exec_line) and "--asr" not in exec_line

    r = _cli("device", "run", "--state", "st", "--print-unit", "--phrase", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    exec_line = next(line for line in r.stdout.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_line)
    rest = words[words.index("run") + 1:]
    assert "--phrase" in rest and "--asr" not in rest and "--mic" in rest, rest
    back = _run_parser().parse_args(rest)  # the unit's options parse back to a phrase-stage run
    assert back.phrase and not back.asr and back.mic


def test_the_default_second_stage_is_auto_and_no_phrase_is_carried(tmp_path):
    """Given no option the agent, `device detect` and the Wyoming server run the default operating
    point's stage ("auto"); ``--no-phrase`` (False) turns it off and the unit carries it."""
    import inspect

    import edge
    from edge.agent import AgentConfig, service_unit
    from edge.agent_unit import unit_options
    from edge.commands.device import second_stage
    from edge.wyoming import WakeServer

    assert AgentConfig().asr == "auto"
    assert inspect.signature(WakeServer).parameters["asr"].default == "auto"
    assert inspect.signature(edge.Device.detect).parameters["asr"].default == "auto"
    assert "--no-phrase" in unit_options(AgentConfig(asr=False))
    assert not {"--asr", "--phrase", "--no-phrase"} & set(unit_options(AgentConfig(asr="auto")))
    unit = service_unit(tmp_path, AgentConfig(asr=False), exe="edgelearn")
    words = shlex.split(next(line for line in unit.splitlines() if line.startswith("ExecStart=")))
    back = _run_parser().parse_args(words[words.index("run") + 1:])
    assert back.no_phrase and not back.phrase and not back.asr and second_stage(back) is False
    assert second_stage(_run_parser().parse_args(["--state", "st", "--mic"])) == "auto"
    assert second_stage(_run_parser().parse_args(["--state", "st", "--mic", "--asr"])) is True


def _run_parser():
    import argparse

    from edge.commands import device as device_cmd

    top = argparse.ArgumentParser(prog="edgelearn device")
    device_cmd.add_arguments(top)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_the_agent_runs_with_the_phrase_stage_and_counts_what_it_judged(bundle, renders, tmp_path):
    """``device run --phrase`` (``AgentConfig(asr="phrase")``): the agent's events are the phrase stage's,
    and agent.json's second_stage counts its rejections, snippets and their audio."""
    import edge
    from edge.agent import Agent, AgentConfig, read_status
    from edge.device import CHUNK

    texts = ["yes", "nobody knows", "stop", "download"]
    pcm, spans = _stream(texts, "en-us+m1")
    state = tmp_path / "st"
    det, _ = edge.Device(state).detector(replay=False, asr="phrase")
    want = detect_pcm(det, pcm)
    assert _said(want, texts, spans) == [("yes", "yes"), ("stop", "stop")] and det.rejected >= 1
    out = []
    agent = Agent(state, AgentConfig(source=[pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)], asr="phrase"))
    agent._emit = out.append
    agent.run()
    assert [(e["keyword"], e["time_s"]) for e in out] == [(e["keyword"], e["time_s"]) for e in want]
    stage = read_status(state)["second_stage"]
    assert stage["rejected"] == det.rejected and stage["asr_decoded"] == det.asr.decoded == len(want) + det.rejected
    assert stage["asr_audio_s"] == pytest.approx(det.asr.seconds, abs=0.01)
