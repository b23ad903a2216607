"""Target profiles: what a deployment target has (memory, engines, link) and which
adaptation tier it gets, read from TOML and validated field by field.

Shipped profiles live in ``host/profiles/<name>.toml``; a user may pass the path
of their own file anywhere a target name is accepted.

    >>> from host.partition.profiles import load_profile
    >>> p = load_profile("esp32")
    >>> p.budget_bytes, p.engines["cpu"].macs_per_s
    (102400, 400000.0)

Units are part of the field names (``_bytes``, ``_macs_per_s``, ``_pj_per_mac``,
``_nj_per_byte``, ``_bytes_per_s``, ``_ms``), so a profile reads without a manual.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from edge.adapt.strategies import OPTIMIZERS
from edge.errors import EdgelearnError

PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"

KINDS = ("mcu", "linux", "phone")
RUNTIMES = ("micropython", "tflite-micro", "litert", "onnxruntime")
TIERS = ("prototypes", "bias-only", "lora", "residual-adapter", "full")


class ProfileError(EdgelearnError):
    """A target profile is missing, malformed or names an unknown target."""


@dataclass(frozen=True)
class Engine:
    """One compute engine (CPU or NPU) of a target."""

    name: str
    macs_per_s: float
    energy_pj_per_mac: float
    # Operators this engine runs in int8; empty tuple means "every operator".
    ops: tuple[str, ...] = ()
    # NPU hardware limits checked per op by the placement (None = no limit).
    max_stride: int | None = None
    max_kernel_hw: int | None = None
    max_pool_kernel_hw: int | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    kind: str
    runtime: str
    int8_only: bool
    sram_bytes: int
    flash_bytes: int
    budget_bytes: int          # what the model may use at run time (heap / arena / RAM share)
    budget_holds_weights: bool  # MicroPython keeps weights in the heap; TFLM/LiteRT map them from flash
    engines: dict[str, Engine]
    uplink_bytes_per_s: float
    rtt_ms: float
    tx_energy_nj_per_byte: float
    tier: str
    rank: int
    optimizer: str
    max_latency_ms: float
    source: Path = field(default=Path())

    @property
    def npu(self) -> Engine | None:
        return self.engines.get("npu")

    @property
    def cpu(self) -> Engine:
        return self.engines["cpu"]


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def _resolve(name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    if s.endswith(".toml") or "/" in s or "\\" in s:
        path = Path(s)
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist",
                               fix=f"pass an existing .toml file or one of: {', '.join(available_profiles())}")
        return path
    path = PROFILE_DIR / f"{s}.toml"
    if not path.is_file():
        names = available_profiles()
        near = _nearest(s, names)
        raise ProfileError(f"unknown target {s!r} (shipped targets: {', '.join(names)})",
                           fix=f"did you mean {near!r}? or pass the path of your own profile .toml"
                           if near else "pass one of those names or the path of your own profile .toml")
    return path


def _nearest(word: str, names: list[str]) -> str | None:
    import difflib
    got = difflib.get_close_matches(word, names, n=1, cutoff=0.5)
    return got[0] if got else None


class _Reader:
    """Pulls typed fields out of the parsed TOML, naming file and dotted field on error."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    def _fail(self, key: str, what: str) -> ProfileError:
        return ProfileError(f"{self.path}: field {key!r} {what}",
                            fix=f"compare with {PROFILE_DIR / 'esp32.toml'} and fix that field")

    def get(self, key: str, kind: type | tuple, unit: str = "", default=..., table: dict | None = None,
            prefix: str = ""):
        node = self.data if table is None else table
        full = f"{prefix}{key}"
        if key not in node:
            if default is not ...:
                return default
            raise self._fail(full, f"is missing (expected {_describe(kind, unit)})")
        value = node[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise self._fail(full, f"is {type(value).__name__} {value!r}, expected {_describe(kind, unit)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise self._fail(full, f"is {value!r}, expected a non-negative {_describe(kind, unit)}")
        return value

    def table(self, key: str, prefix: str = "") -> dict:
        return self.get(key, dict, "table", prefix=prefix)

    def choice(self, key: str, choices: tuple[str, ...], table: dict, prefix: str, default=...) -> str:
        value = self.get(key, str, default=default, table=table, prefix=prefix)
        if value not in choices:
            raise self._fail(f"{prefix}{key}", f"is {value!r}, expected one of {', '.join(choices)}")
        return value


def _describe(kind, unit: str) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
             dict: "a [table]", list: "a list"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    text = " or ".join(names.get(k, k.__name__) for k in kinds)
    return f"{text} in {unit}" if unit and unit != "table" else text


_KNOWN = {
    "target": {"name", "description", "kind", "runtime", "int8_only", "max_latency_ms"},
    "memory": {"sram_bytes", "flash_bytes", "budget_bytes", "budget_holds_weights"},
    "link": {"uplink_bytes_per_s", "rtt_ms", "tx_energy_nj_per_byte"},
    "adaptation": {"tier", "rank", "optimizer"},
    "engine": {"macs_per_s", "energy_pj_per_mac", "ops", "max_stride", "max_kernel_hw",
               "max_pool_kernel_hw"},
}


def _check_known(r: _Reader, data: dict) -> None:
    """Reject unknown keys: a typo such as ``budget_byte`` must not silently fall back."""
    for key, value in data.items():
        if key == "compute":
            continue
        if key not in _KNOWN:
            raise r._fail(key, f"is not a known table (expected {', '.join(sorted(_KNOWN) + ['compute'])})")
    for table in _KNOWN.keys() - {"engine"}:
        for key in data.get(table, {}) if isinstance(data.get(table), dict) else ():
            if key not in _KNOWN[table]:
                near = _nearest(key, sorted(_KNOWN[table]))
                raise r._fail(f"{table}.{key}", "is not a known field"
                              + (f" (did you mean {near!r}?)" if near else ""))
    compute = data.get("compute", {})
    for ename, eng in compute.items() if isinstance(compute, dict) else ():
        for key in eng if isinstance(eng, dict) else ():
            if key not in _KNOWN["engine"]:
                near = _nearest(key, sorted(_KNOWN["engine"]))
                raise r._fail(f"compute.{ename}.{key}", "is not a known field"
                              + (f" (did you mean {near!r}?)" if near else ""))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped target by name (``"rpi4"``) or a user profile by path."""
    path = _resolve(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path} is not valid TOML ({e})", fix="fix the syntax at that line") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{path} is not UTF-8 text", fix="save the profile as UTF-8 TOML") from None
    r = _Reader(path, data)
    _check_known(r, data)
    t, m, link, ad = r.table("target"), r.table("memory"), r.table("link"), r.table("adaptation")
    compute = r.table("compute")
    engines = {}
    for ename in compute:
        e = r.get(ename, dict, "table", table=compute, prefix="compute.")
        pre = f"compute.{ename}."
        ops = r.get("ops", list, default=[], table=e, prefix=pre)
        if not all(isinstance(o, str) for o in ops):
            raise r._fail(pre + "ops", "must be a list of TFLite operator names such as \"CONV_2D\"")
        engines[ename] = Engine(
            name=ename,
            macs_per_s=r.get("macs_per_s", float, "MAC/s", table=e, prefix=pre),
            energy_pj_per_mac=r.get("energy_pj_per_mac", float, "pJ per MAC", table=e, prefix=pre),
            ops=tuple(o.upper() for o in ops),
            max_stride=r.get("max_stride", int, default=None, table=e, prefix=pre),
            max_kernel_hw=r.get("max_kernel_hw", int, default=None, table=e, prefix=pre),
            max_pool_kernel_hw=r.get("max_pool_kernel_hw", int, default=None, table=e, prefix=pre),
        )
    if "cpu" not in engines:
        raise r._fail("compute.cpu", "is missing (every target needs a CPU engine for fallback)")
    if engines["cpu"].macs_per_s <= 0:
        raise r._fail("compute.cpu.macs_per_s", "must be greater than 0 MAC/s")
    prof = Profile(
        name=r.get("name", str, table=t, prefix="target."),
        description=r.get("description", str, table=t, prefix="target."),
        kind=r.choice("kind", KINDS, t, "target."),
        runtime=r.choice("runtime", RUNTIMES, t, "target."),
        int8_only=r.get("int8_only", bool, table=t, prefix="target."),
        sram_bytes=r.get("sram_bytes", int, "bytes", table=m, prefix="memory."),
        flash_bytes=r.get("flash_bytes", int, "bytes", table=m, prefix="memory."),
        budget_bytes=r.get("budget_bytes", int, "bytes", table=m, prefix="memory."),
        budget_holds_weights=r.get("budget_holds_weights", bool, table=m, prefix="memory."),
        engines=engines,
        uplink_bytes_per_s=r.get("uplink_bytes_per_s", float, "bytes/s", table=link, prefix="link."),
        rtt_ms=r.get("rtt_ms", float, "ms", table=link, prefix="link."),
        tx_energy_nj_per_byte=r.get("tx_energy_nj_per_byte", float, "nJ per byte", table=link, prefix="link."),
        tier=r.choice("tier", TIERS, ad, "adaptation."),
        rank=r.get("rank", int, "rank / bottleneck width", default=4, table=ad, prefix="adaptation."),
        optimizer=r.choice("optimizer", OPTIMIZERS, ad, "adaptation.", default="sgd"),
        max_latency_ms=r.get("max_latency_ms", float, "ms per 1 s window", table=t, prefix="target."),
        source=path,
    )
    if prof.budget_bytes <= 0:
        raise r._fail("memory.budget_bytes", "must be greater than 0 bytes")
    return prof
