"""Options generated from config dataclasses (host/config_args.py): no flags given means the
dataclass's own defaults; units and switches round-trip; every CLI that uses it builds its config."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

import pytest

from host.config_args import add_config_arguments, config_from_args


@dataclass
class Knobs:
    replicas: int = 2
    delay: float = 0.25
    fast: bool = False
    mode: str = "sync"
    parts: list = field(default_factory=list)


NAMES = ["replicas", "delay", "fast", "mode", "parts"]


def parser(**kw):
    p = argparse.ArgumentParser()
    add_config_arguments(p, Knobs, NAMES, **kw)
    return p


def test_defaults_types_switches_and_units_round_trip():
    units = {"delay": "ms"}
    p = parser(units=units, choices={"mode": ("sync", "async")})
    assert config_from_args(Knobs, p.parse_args([]), NAMES, units=units) == Knobs()
    a = p.parse_args(["--replicas", "3", "--delay-ms", "40", "--fast", "--mode", "async", "--parts", "0.5", "0.25"])
    assert config_from_args(Knobs, a, NAMES, units=units) == \
        Knobs(replicas=3, delay=0.04, fast=True, mode="async", parts=[0.5, 0.25])
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "sometimes"])
    with pytest.raises(SystemExit):
        p.parse_args(["--replicas", "two"])
    with pytest.raises(SystemExit):
        p.parse_args(["--parts", "half"])


def test_an_unknown_field_is_a_programming_error():
    with pytest.raises(KeyError, match="no field 'nope'"):
        add_config_arguments(argparse.ArgumentParser(), Knobs, ["nope"])


@pytest.mark.parametrize("command", ["aggregator", "fleet", "serve"])
def test_each_cli_without_options_builds_the_default_config(command):
    from host.aggregator.config import AggregatorConfig
    from host.commands import aggregator as agg
    from host.commands import fleet, serve
    from host.fleet.simulate import SimConfig
    from host.serve.config import ServeConfig

    p = argparse.ArgumentParser()
    if command == "aggregator":
        agg.add_arguments(p)
        args = p.parse_args(["init", "--state", "s"])
        assert config_from_args(AggregatorConfig, args, agg.INIT_FIELDS) == AggregatorConfig()
    elif command == "fleet":
        fleet.add_arguments(p)
        args = p.parse_args(["simulate"])
        got = config_from_args(SimConfig, args, fleet.SIM_FIELDS, fresh_head=not args.shipped_head)
        assert asdict(got) == asdict(SimConfig())
    else:
        serve.add_arguments(p)
        args = p.parse_args(["--bundle", "b"])
        assert config_from_args(ServeConfig, args, serve.SERVE_FIELDS, units=serve.UNITS) == ServeConfig()


def test_fleet_learning_rate_is_the_tasks_own_unless_given():
    """`fleet simulate --task shipped-head` trains the whole shipped head with its own step (0.02, the
    bench's), not the fresh head's 0.1; `--learning-rate` overrides it; a negative one is one sentence."""
    from edge.errors import EdgelearnError
    from host.commands import fleet
    from host.fleet.simulate import SimConfig, aggregator_config, task_learning_rate

    p = argparse.ArgumentParser()
    fleet.add_arguments(p)

    def cfg(*argv):
        args = p.parse_args(["simulate", *argv])
        return config_from_args(SimConfig, args, fleet.SIM_FIELDS, fresh_head=not args.shipped_head)

    assert aggregator_config(cfg("--task", "shipped-head")).learning_rate == 0.02
    assert aggregator_config(cfg()).learning_rate == 0.1
    assert aggregator_config(cfg("--task", "shipped-head", "--learning-rate", "0.05")).learning_rate == 0.05
    with pytest.raises(EdgelearnError, match="below 0"):
        task_learning_rate(cfg("--learning-rate", "-0.1"))
