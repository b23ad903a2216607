"""The federated aggregator: an HTTP service (Starlette + uvicorn) with its state in SQLite (WAL), or
in PostgreSQL shared by any number of replicas (``--db postgresql://...``, ``pgstore``).

    $ edgelearn aggregator init --state agg/ --bundle models/kws-dscnn-s --signing-key keys/agg.key
    $ edgelearn aggregator provision --state agg/ --device pi-001 --out keys/
    $ edgelearn aggregator serve --state agg/ --port 8470
    $ edgelearn aggregator revoke --state agg/ pi-001     # its key refused from now on

Layers: ``store`` (SQLite tables, one writer; ``pgstore``: the same on PostgreSQL, one advisory
lock per write transaction), ``policy`` (eligibility,
fairness, pace steering), ``models`` (versions, signed bundles, held-out
check), ``rounds`` (sync rounds with over-selection/quorum/deadline, FedBuff
async), ``app`` (HTTP, which knows none of the math). docs/protocol.md is the
wire-level contract. An operator publishes a version outside rounds (a hand-fixed head) with
``setup.publish_version`` while the service is stopped.
"""
