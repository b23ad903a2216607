"""What the aggregator reports about itself: rounds, models, devices, revocations.

``status_of`` for a running aggregator (``GET /v1/status``, the fleet simulators) and
``read_status`` for a state directory or shared database another process may be serving
(``edgelearn aggregator status``: it only reads). Split out of ``host/aggregator/app.py``, which
re-exports all three names.
"""

from __future__ import annotations

from pathlib import Path

from edge.errors import EdgelearnError
from host.aggregator.config import AggregatorConfig, shared_config
from host.aggregator.errors import revoked_on
from host.aggregator.store import Store, open_store, sqlite_path, state_db


def read_status(state_dir, db=None) -> dict:
    """``status_of`` for a state directory (or shared database) that another process may be serving:
    it only reads (no lock, no round opened), so ``edgelearn aggregator status`` works beside ``serve``."""
    from types import SimpleNamespace

    from host.fl.strategies import make_strategy
    d = Path(state_dir)
    db = state_db(d, db)
    if db and not str(db).startswith("sqlite:"):
        store = open_store(db, d)
        try:
            cfg = shared_config(store)
        except BaseException:
            store.close()
            raise
    else:
        cfg = AggregatorConfig.load(d / "config.json")
        path = sqlite_path(db, d) or d / "state.sqlite"
        if not path.exists():
            raise EdgelearnError(f"{path}: holds no aggregator database",
                                 fix="pass the --db this state was initialised with, or run "
                                     "`edgelearn aggregator init` first")
        store = Store(path, cfg.synchronous, read_only=True)  # no WAL pragma, no schema: works on a backup
    try:
        name = make_strategy(cfg.strategy, **cfg.strategy_options).name
        if cfg.dp_noise > 0 or cfg.dp_clip > 0:
            name = f"dp-{name}"
        r = store.one("SELECT round_id FROM rounds WHERE status='open' ORDER BY round_id DESC LIMIT 1")
        cols = ("round_id", "model_version", "status", "opened", "deadline", "target", "selected", "accepted")
        row = None if r is None else dict(zip(cols, store.one(
            f"SELECT {', '.join(cols)} FROM rounds WHERE round_id=?", (r[0],))))
        cur = store.get_meta("current_version")
        view = SimpleNamespace(store=store, cfg=cfg, group=None,
                               rounds=SimpleNamespace(strategy=SimpleNamespace(name=name), round=row),
                               registry=SimpleNamespace(current=None if cur is None else int(cur)))
        return status_of(view, revocations=True)
    finally:
        store.close()


def status_of(agg, rounds_limit: int | None = 50, revocations: bool = False) -> dict:
    """The aggregator's state: the newest ``rounds_limit`` rounds (None: every one), every model; with
    ``revocations`` (``aggregator status``; not the unauthenticated /v1/status, which names no device)
    ``revoked``: every revoked device, [{"device_id", "revoked": UTC date}] by id."""
    s = agg.store
    rounds = [dict(zip(("round_id", "mode", "model_version", "status", "opened", "deadline", "target", "selected",
                        "accepted", "closed", "result_version", "accuracy", "bytes", "note"), r))
              for r in s.all("SELECT round_id, mode, model_version, status, opened, deadline, target, selected, "
                             "accepted, closed, result_version, accuracy, bytes, note FROM rounds "
                             "ORDER BY round_id DESC" + ("" if rounds_limit is None else f" LIMIT {int(rounds_limit)}"))]
    models = [dict(zip(("version", "parent", "round_id", "status", "accuracy", "epsilon"), r))
              for r in s.all("SELECT version, parent, round_id, status, accuracy, epsilon FROM models ORDER BY version")]
    return {"mode": agg.cfg.mode, "strategy": agg.rounds.strategy.name, "current_version": agg.registry.current,
            "devices": s.one("SELECT COUNT(*) FROM devices")[0], "round": agg.rounds.round,
            "store": "postgresql" if s.shared else "sqlite",
            "group_commit": {"batches": agg.group.batches, "updates": agg.group.committed} if agg.group else None,
            "rounds": rounds, "models": models, **({"revoked": revoked_devices(s)} if revocations else {})}


def revoked_devices(store) -> list:
    """The revoked devices ([{"device_id", "revoked"}], by id); none in a database from before
    revocations (opened read-only by ``status``, so its schema was never upgraded)."""
    if not store.shared and "revoked" not in {r[1] for r in store.all("PRAGMA table_info(devices)")}:
        return []
    return [{"device_id": d, "revoked": revoked_on(t)}
            for d, t in store.all("SELECT device_id, revoked FROM devices WHERE revoked IS NOT NULL ORDER BY device_id")]
