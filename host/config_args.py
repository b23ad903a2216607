"""Command-line options from a config dataclass: each field is written once, in its dataclass.

``add_config_arguments`` adds one ``--field-name`` per named field, its type and default read from the
dataclass (a bool is a switch, a list takes numbers); ``config_from_args`` builds the dataclass back from the parsed options.
A field kept in seconds can be offered in milliseconds (``units={"max_queue_delay": "ms"}``:
``--max-queue-delay-ms``, divided by 1000 on the way in) or with an ``-s`` suffix (``"s"``).

    add_config_arguments(p, AggregatorConfig, ["mode", "clients_per_round"], choices={"mode": ("sync", "async")})
    cfg = config_from_args(AggregatorConfig, args, ["mode", "clients_per_round"])

argparse is the standard library's; this only keeps a field's name, type and default in one place.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

_SCALE = {"ms": 1000.0, "s": 1.0}


def _field(cls, name):
    for f in fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def _flag(name: str, unit: str | None) -> str:
    return "--" + name.replace("_", "-") + (f"-{unit}" if unit else "")


def add_config_arguments(parser, cls, names, *, help=None, choices=None, units=None) -> None:
    """One option per field of ``cls`` in ``names`` (help texts, choices and units by field name)."""
    help, choices, units = help or {}, choices or {}, units or {}
    for name in names:
        f = _field(cls, name)
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        unit = units.get(name)
        kw = {"dest": name, "help": help.get(name)}
        if isinstance(default, bool):
            parser.add_argument(_flag(name, unit), action="store_true", default=default, **kw)
            continue
        if isinstance(default, list):  # a list of numbers (``--eval-shrink 0.5 0.25``)
            parser.add_argument(_flag(name, unit), nargs="*", type=float, default=default, metavar="X", **kw)
            continue
        if unit:
            default = default * _SCALE[unit]
            kw["metavar"] = f"{name}_{unit}".upper()
        parser.add_argument(_flag(name, unit), type=type(default), default=default,
                            choices=tuple(choices[name]) if name in choices else None, **kw)


def config_from_args(cls, args, names, *, units=None, **extra):
    """``cls(**{name: args.name for name in names}, **extra)``, undoing each field's display unit."""
    units = units or {}
    values = {}
    for name in names:
        v = getattr(args, name)
        if name in units:
            v = v / _SCALE[units[name]]
        values[name] = v
    return cls(**values, **extra)


def as_options(text: str, names, *, units=None) -> str:
    """``text`` with each field name in ``names`` written as its command-line option (``clients_per_round``
    -> ``--clients-per-round``), for a config's complaint about values the user gave as options."""
    import re

    units = units or {}
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", _flag(name, units.get(name)), text)
    return text


def options_config(cls, args, names, *, units=None, **extra):
    """``config_from_args``, with a config's own check (an EdgelearnError that says to fix its file) said
    in terms of the options: ``--clients-per-round must be >= 1; change that option``."""
    from edge.errors import EdgelearnError

    try:
        return config_from_args(cls, args, names, units=units, **extra)
    except EdgelearnError as e:
        problem = as_options(e.problem, names, units=units).split(": ", 1)[-1]
        raise EdgelearnError(problem, fix="change that option (see --help)") from None
