"""The Pi client against an in-process aggregator: learning, codecs, chunks, subsets, seq on disk,
and refusing a tampered bundle."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator_helpers import FIRST
from edge.errors import BundleError
from edge.fl import FLClient, FLError, FederatedHeadTrainer, head_logits
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import InProcessTransport, make_state, small_params

OK = {"battery": 0.9, "charging": True, "network": "wifi"}


def synthetic(n_dev, seed=0, per_dev=60, classes=37, dim=64):
    """Non-negative embeddings with class means (like pooled ReLU features), 6 classes per device."""
    rng = np.random.default_rng(seed)
    means = np.abs(rng.standard_normal((classes, dim))) * 2
    def draw(labels):
        return (np.maximum(means[labels] + rng.standard_normal((len(labels), dim)), 0).astype(np.float32), labels)
    devs = [draw(rng.choice(rng.choice(classes, 6, replace=False), per_dev)) for _ in range(n_dev)]
    return devs, draw(rng.integers(0, classes, 800))


def fleet(tmp_path, cfg, n=6, heldout=None, params=None):
    state, keys = make_state(tmp_path, cfg, n_devices=n, heldout=heldout, params=params)
    return state, keys


def test_fleet_learns_from_a_random_head_over_rounds(tmp_path):
    devs, (Xh, yh) = synthetic(6)
    p = small_params(seed=3)
    cfg = AggregatorConfig(clients_per_round=6, overselect=1.0, local_epochs=2, learning_rate=0.05,
                           eval_tolerance=1.0)
    state, keys = fleet(tmp_path, cfg, params=p, heldout=(Xh, yh))
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        cs = [FLClient(t, f"dev{i}", keys[f"dev{i}"], tmp_path / f"c{i}", trusted_keys=state / "keys",
                       data=devs[i], seed=i) for i in range(6)]
        reg = app.state.aggregator.registry
        acc0 = reg.accuracy(reg.params())
        for _ in range(4):
            for c in cs:
                assert c.run_once(OK)["action"] == "uploaded"
        assert reg.current == FIRST + 4
        assert reg.accuracy(reg.params()) > acc0 + 0.2  # 37 classes, chance is 0.03
        # every client runs the newest bundle after its next check-in
        cs[0].run_once(OK)
        assert cs[0].current_version() == reg.current


@pytest.mark.parametrize("codec", ["dense_f32", "int8", "topk_int8"])
def test_codecs_chunks_and_seq_survive_a_client_restart(tmp_path, codec):
    devs, _ = synthetic(2)
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.0, codec=codec, chunk_size=2000, topk_fraction=0.1)
    state, keys = fleet(tmp_path, cfg, n=2)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        out = c.run_once(OK)
        assert out["action"] == "uploaded" and out["status"] == "accepted"
        sent = c.bytes_up
        assert sent > 0
        if codec == "topk_int8":
            assert (tmp_path / "c0" / "topk_residuals.npz").exists()
        # restart the device: the next frame uses a higher seq than any sent before
        c2 = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        assert c2.seq == c.seq
        other = FLClient(t, "dev1", keys["dev1"], tmp_path / "c1", trusted_keys=state / "keys", data=devs[1])
        other.run_once(OK)   # closes round 1
        assert c2.run_once(OK)["status"] == "accepted"
        assert c2.seq == c.seq + 1


def test_bias_only_sends_a_subset_frame(tmp_path):
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1), n=1)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0],
                     trainer=FederatedHeadTrainer("bias-only"))
        reg = app.state.aggregator.registry
        before = reg.params()
        task = c.checkin(OK)["task"]
        delta, n = c.train(task)
        assert set(delta) == {"proj.b", "classifier.b"}
        frame = c.encode(task, delta, n)
        from host.wire_numpy import decode_update
        u = decode_update(frame, keys["dev0"])
        assert u.header.subset and {x.name for x in u.tensors} == {"proj.b", "classifier.b"}
        assert c.upload(frame)["status"] == "accepted"
        after = reg.params()
        np.testing.assert_array_equal(after["classifier.w"], before["classifier.w"])
        assert not np.array_equal(after["classifier.b"], before["classifier.b"])


def test_a_tampered_bundle_is_refused_and_nothing_changes(tmp_path):
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1), n=1)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        class Tamper:
            def request(self, m, p, body=b"", headers=None):
                s, raw = t.request(m, p, body, headers)
                if p.endswith(".zip"):
                    raw = raw.replace(b"classifier", b"classifieR", 1) if b"classifier" in raw else raw[:-10]
                return s, raw
        c = FLClient(Tamper(), "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        with pytest.raises(BundleError):
            c.run_once(OK)
        assert c.store.pointer()["current"] is None and c.seq == 0
        # a device that does not trust the aggregator's key refuses its bundles as well
        c2 = FLClient(t, "dev0", keys["dev0"], tmp_path / "c1", trusted_keys="models/keys", data=devs[0])
        with pytest.raises(BundleError):
            c2.run_once(OK)


def test_server_refusals_surface_as_flerror_with_the_reason(tmp_path):
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1), n=1)
    with InProcessTransport(build_app(state, tick_interval=0)) as t:
        c = FLClient(t, "dev0", b"w" * 32, tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        with pytest.raises(FLError) as e:
            c.run_once(OK)
        assert e.value.status == 401 and e.value.reason == "AuthError"


def test_tail_logits_match_the_plain_head_at_identity_projection():
    p = small_params()
    X = np.abs(np.random.default_rng(0).standard_normal((5, 64))).astype(np.float32)
    np.testing.assert_allclose(head_logits(p, X), X @ p["classifier.w"] + p["classifier.b"], rtol=1e-5)


def test_a_round_verifies_the_bundle_once(tmp_path):
    """Training loads (and verifies) the round's bundle; encoding the frame reuses that head."""
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1), n=1)
    with InProcessTransport(build_app(state, tick_interval=0)) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        calls = []
        for name in ("current", "install"):
            real = getattr(c.store, name)
            setattr(c.store, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
        assert c.run_once(OK)["action"] == "uploaded"
        assert calls == ["install"]   # a round with a new bundle: its install is the one verification
        task = c.checkin(OK)["task"]
        c.ensure_model(int(task["model_version"]))
        calls.clear()
        delta, n = c.train(task)      # a round on the bundle already installed
        c.encode(task, delta, n)
        assert calls == ["current"]


def test_damaged_client_state_is_set_aside_and_the_next_upload_still_counts(tmp_path, capsys):
    """fl_state.json and topk_residuals.npz are written atomically, so only outside damage breaks
    them: the client keeps each as NAME.damaged, says so once, and goes on without reusing a
    sequence number (it resumes at the Unix time in seconds)."""
    import json

    devs, _ = synthetic(2)
    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, codec="topk_int8", topk_fraction=0.1)
    state, keys = fleet(tmp_path, cfg, n=2)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        assert c.run_once(OK)["status"] == "accepted"
        (tmp_path / "c0" / "fl_state.json").write_bytes(b'{"seq": 1')  # cut short
        (tmp_path / "c0" / "topk_residuals.npz").write_bytes(b"PK\x03\x04 not a zip")
        c2 = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        err = capsys.readouterr().err
        assert err.count("is damaged") == 2 and "the sequence resumes at" in err
        assert (tmp_path / "c0" / "fl_state.json.damaged").read_bytes() == b'{"seq": 1'
        assert (tmp_path / "c0" / "topk_residuals.npz.damaged").exists() and c2.topk.residuals == {}
        assert c2.seq > c.seq
        assert c2.run_once(OK)["status"] == "accepted"  # round 2: the aggregator takes the new number
        assert json.loads((tmp_path / "c0" / "fl_state.json").read_text())["seq"] == c2.seq
        for bad in (b'{"seq": -3}', b'{"seq": true}', b"[]"):
            (tmp_path / "c0" / "fl_state.json").write_bytes(bad)
            assert FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys").seq > c.seq
