"""`edgelearn aggregator` and `edgelearn fleet simulate` refuse what cannot work in one sentence,
before anything is written or started: a quorum above the population, a busy or impossible port or
host, provisioning where no aggregator is, a bad signing key or --db directory at init (and a failed
init leaves nothing behind); a state initialised with --db remembers it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]


def edgelearn(*args, cwd=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's code, from any directory
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def one_sentence(res, *words):
    """A one-line user error (exit 2, no traceback) that names every one of ``words``."""
    err = "\n".join(line for line in res.stderr.strip().splitlines() if not line.startswith("INFO: "))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture
def state(tmp_path):
    """An initialised aggregator state (small head, no devices)."""
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state

    st, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=0)
    return st


# --- fleet simulate: a quorum the population cannot reach ---------------------------------------

def test_fleet_simulate_refuses_more_clients_per_round_than_devices(tmp_path):
    res = edgelearn("fleet", "simulate", "--devices", "3", "--rounds", "2", "--out", "fl", cwd=tmp_path, timeout=120)
    one_sentence(res, "10 clients per round from 3 devices", "--clients-per-round 3")
    assert not (tmp_path / "fl").exists()


def test_simulate_itself_refuses_the_same_way_before_any_work(tmp_path):
    from host.fleet.simulate import SimConfig, simulate

    with pytest.raises(EdgelearnError, match="clients per round from 3 devices") as e:
        simulate(SimConfig(devices=3, rounds=1), tmp_path / "out", progress=False)  # no data: refused first
    assert "--clients-per-round 3" in e.value.fix
    assert not (tmp_path / "out").exists()


# --- aggregator serve: host and port ------------------------------------------------------------

def test_aggregator_serve_says_a_busy_port_in_one_sentence_before_serving(state):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = edgelearn("aggregator", "serve", "--state", str(state), "--port", str(port), timeout=120)
    one_sentence(res, str(port), "already in use", "--port")
    assert "serving" not in res.stdout


def test_aggregator_serve_refuses_a_port_out_of_range_and_an_unknown_host(state):
    res = edgelearn("aggregator", "serve", "--state", str(state), "--port", "99999", timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "serving" not in res.stdout
    assert "1 to 65535" in res.stderr.strip().splitlines()[-1], res.stderr
    res = edgelearn("aggregator", "serve", "--state", str(state), "--host", "no.such.host.invalid", "--port", "0",
                    timeout=120)
    one_sentence(res, "no.such.host.invalid", "--host")
    assert "serving" not in res.stdout


def test_aggregator_serve_names_the_port_it_listens_on(state):
    """--port 0: the `serving ... on` line names the port the OS chose, and it answers there."""
    import httpx

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "edge.cli", "aggregator", "serve", "--state", str(state),
                             "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "aggregator: serving" in line and "on http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        r = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=30)
        assert r.status_code == 200 and r.json()["current_version"] is not None
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


# --- aggregator provision: only where init made an aggregator ------------------------------------

def test_provision_refuses_a_state_without_an_aggregator_and_creates_nothing(tmp_path):
    res = edgelearn("aggregator", "provision", "--state", "nope", "--device", "d2", "--out", "devkeys",
                    cwd=tmp_path, timeout=120)
    one_sentence(res, "nope: no aggregator here", "edgelearn aggregator init")
    assert not (tmp_path / "nope").exists() and not (tmp_path / "devkeys").exists()


def test_provision_refuses_an_empty_state_directory(tmp_path):
    from host.aggregator.setup import provision

    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgelearnError, match="no aggregator here"):
        provision(tmp_path / "empty", "d1")
    assert list((tmp_path / "empty").iterdir()) == []


# --- aggregator init: inputs checked first, a failure leaves nothing ------------------------------

def test_init_with_a_bad_signing_key_writes_nothing_and_a_rerun_works(tmp_path):
    (tmp_path / "bad.key").write_text("not a key\n")
    res = edgelearn("aggregator", "init", "--state", "agg4", "--signing-key", "bad.key", cwd=tmp_path, timeout=300)
    one_sentence(res, "bad.key")
    assert not (tmp_path / "agg4").exists()
    res = edgelearn("aggregator", "init", "--state", "agg4", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "published" in res.stdout


def test_a_failed_init_removes_only_what_it_wrote(tmp_path, monkeypatch):
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import small_params
    from host.aggregator.models import ModelRegistry
    from host.aggregator.setup import init_state

    d = tmp_path / "agg"
    d.mkdir()
    (d / "notes.txt").write_text("mine\n")  # what was there before init stays

    def boom(*a, **k):
        raise EdgelearnError("the base bundle broke", fix="-")

    monkeypatch.setattr(ModelRegistry, "init_from_bundle", boom)
    with pytest.raises(EdgelearnError, match="broke"):
        init_state(d, AggregatorConfig(), params=small_params())
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    monkeypatch.undo()
    init_state(d, AggregatorConfig(), params=small_params())  # not "already holds an aggregator"
    assert (d / "state.sqlite").exists() and (d / "notes.txt").read_text() == "mine\n"


def test_init_refuses_a_db_in_a_missing_directory_before_writing(tmp_path):
    res = edgelearn("aggregator", "init", "--state", "aggsq", "--db", "sqlite:///nonexistent/dir/x.db",
                    cwd=tmp_path, timeout=300)
    one_sentence(res, "nonexistent/dir", "does not exist")
    assert not (tmp_path / "aggsq").exists() and not (tmp_path / "nonexistent").exists()


def test_a_state_remembers_the_db_it_was_initialised_with(tmp_path):
    from host.aggregator.app import read_status
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import small_params
    from host.aggregator.setup import init_state, provision

    (tmp_path / "dbdir").mkdir()
    st = tmp_path / "aggsq"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative --db, recorded so that it works from anywhere later
    try:
        init_state(st, AggregatorConfig(), params=small_params(), db="sqlite:///dbdir/x.db")
    finally:
        os.chdir(cwd)
    assert json.loads((st / "config.json").read_text())["db"] == f"sqlite:///{(tmp_path / 'dbdir' / 'x.db').resolve()}"
    provision(st, "d1")  # no db: the recorded one
    assert not (st / "state.sqlite").exists()
    assert read_status(st)["devices"] == 1
    res = edgelearn("aggregator", "status", "--state", str(st), timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["devices"] == 1
    res = edgelearn("aggregator", "init", "--state", str(st), "--db", f"sqlite:///{tmp_path}/dbdir/x.db",
                    timeout=300)
    one_sentence(res, "already holds an aggregator")
