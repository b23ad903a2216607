"""One plan per (model, target): per-layer costs, placement, arena, training memory,
split point and a one-line verdict.

    >>> plan = plan_partition(load_graph("enc.tflite"), load_profile("esp32"))
    >>> plan.verdict
    'too slow: 6662 ms per window on esp32, over its 1000 ms budget; try the c24_b3 DS-CNN variant (~14% of the MACs)'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from host.partition.graph import MEMORY_OPS, Graph, ModelError
from host.partition.memory import plan_arena
from host.partition.placement import best_split, place
from host.partition.profiles import Profile
from host.partition.training import all_strategies, tail_ops

# Operators edgelearn's portable int8 kernels (edge/portable/) implement for MicroPython.
MICROPYTHON_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                   "MEAN", "SOFTMAX", "RELU", "ADD"} | MEMORY_OPS
TIER_STRATEGY = {"bias-only": "bias-only", "prototypes": "bias-only", "lora": "lora",
                 "residual-adapter": "residual-adapter", "full": "full"}


def kb(n: float) -> str:
    return f"{n / 1024:.0f} KB" if n < 10 * 1024 * 1024 else f"{n / 1024 / 1024:.0f} MB"


@dataclass
class Plan:
    graph: Graph
    profile: Profile
    layers: list[dict]
    totals: dict
    verdict: str
    fits: bool
    placement: list
    split: object | None = None
    training: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"model": str(self.graph.path), "target": self.profile.name, "fits": self.fits,
                "verdict": self.verdict, "layers": self.layers, "totals": self.totals,
                "split": None if self.split is None else vars(self.split)}


def check_compatible(g: Graph, profile: Profile) -> None:
    """Raise a precise ModelError for a float model on an int8-only target or an unsupported op."""
    if profile.int8_only and not g.is_int8:
        layer = g.first_float_layer()
        raise ModelError(
            f"{g.path.name} computes in float (layer {layer.index} {layer.op}) but {profile.name} runs int8 only",
            fix="quantize it with `edgelearn quantize` (full-integer int8), or target rpi4/rpi5/phone, which run float")
    if profile.runtime == "micropython":
        for layer in g.layers:
            if layer.op not in MICROPYTHON_OPS:
                raise ModelError(
                    f"layer {layer.index} ({layer.op}) has no MicroPython int8 kernel on {profile.name} "
                    f"(supported: {', '.join(sorted(MICROPYTHON_OPS - MEMORY_OPS))})",
                    fix=f"replace that layer, or cut before layer {layer.index} and run the rest in the cloud "
                        f"(edgelearn partition --target rpi4 shows the cloud split)")


def plan_partition(g: Graph, profile: Profile, objective: str = "latency", strategy: str | None = None,
                   use_vela: bool = True) -> Plan:
    check_compatible(g, profile)
    arena = plan_arena(g)
    placement = place(g, profile)
    if profile.name.startswith("ethos-u") and g.format == "tflite" and use_vela:
        placement = _adopt_vela(g, placement)
    try:
        training = all_strategies(tail_ops(g), "adam" if profile.optimizer == "adam" else "sgd", profile.rank)
    except ModelError:
        training = {}
    strategy = strategy or TIER_STRATEGY[profile.tier]
    train_bytes = training[strategy].total if strategy in training else 0
    weights = g.weight_bytes
    resident = weights if profile.budget_holds_weights else 0
    layers = []
    for layer, pl, live in zip(g.layers, placement, arena.per_layer_live):
        need = resident + arena.tail_bytes + live + train_bytes
        layers.append({"index": layer.index, "op": layer.op, "name": layer.name, "engine": pl.engine,
                       "reason": pl.reason, "macs": layer.macs, "weight_bytes": layer.weight_bytes,
                       "activation_bytes": layer.activation_bytes, "live_arena_bytes": live,
                       "need_bytes": need})
    eng = {e: sum(l.macs for l, p in zip(g.layers, placement) if p.engine == e) for e in ("npu", "cpu")}
    latency_ms = sum(eng[e] / profile.engines[e].macs_per_s for e in eng if e in profile.engines) * 1000
    totals = {"macs": g.total_macs, "weight_bytes": weights, "arena_bytes": arena.arena_bytes,
              "arena_head_bytes": arena.head_bytes, "arena_tail_bytes": arena.tail_bytes,
              "training_bytes": {k: v.total for k, v in training.items()},
              "training_strategy": strategy, "budget_bytes": profile.budget_bytes,
              "latency_ms": round(latency_ms, 3), "npu_ops": sum(p.engine == "npu" for p in placement),
              "cpu_ops": sum(p.engine == "cpu" for p in placement),
              "arena_approximate_ops": arena.approximate_ops}
    need = resident + arena.arena_bytes + train_bytes
    totals["need_bytes"] = need
    split = best_split(g, profile, objective) if profile.kind in ("linux", "phone") else None
    verdict, fits = _verdict(g, profile, layers, need, weights, arena.arena_bytes, train_bytes, strategy,
                             latency_ms, split)
    return Plan(g, profile, layers, totals, verdict, fits, placement, split, training)


def _adopt_vela(g: Graph, placement: list) -> list:
    """For Ethos-U targets the real compiler decides: Vela rewrites some ops our rules
    would refuse (e.g. a stride-4 VALID conv). Its rows are matched by output tensor name."""
    from host.partition.placement import Placement, vela_available, vela_report

    if not vela_available():
        return placement
    rep = vela_report(g.path)
    target: dict[str, set] = {}
    for row in rep["layers"]:
        target.setdefault(row["name"], set()).add(row["target"])
    warned = " ".join(rep["warnings"])
    out = []
    for layer, ours in zip(g.layers, placement):
        got = target.get(layer.name)
        if not got:
            out.append(ours)  # Vela removed the op (e.g. a RESHAPE folded into its neighbours)
        elif "npu" in got:
            out.append(Placement(layer.index, "npu", ""))
        else:
            why = ours.reason or ("Vela: " + warned[warned.find(layer.op):][:80] if layer.op in warned
                                  else "Vela placed it on the CPU")
            out.append(Placement(layer.index, "cpu", why))
    return out


def _variant_hint(g: Graph, profile: Profile, over_bytes: float, over_time: float) -> str:
    """Suggest the widest DS-CNN width that fits, scaling weights/MACs ~ w^2 and activations ~ w."""
    from host.partition.zoo import VARIANTS

    for c, b in VARIANTS:
        a = c / 64
        if (over_bytes <= 0 or a * over_bytes <= profile.budget_bytes * 0.9) and \
                (over_time <= 0 or a * a * over_time <= profile.max_latency_ms):
            if a < 1:
                return f"the c{c}_b{b} DS-CNN variant (~{a * a:.0%} of the MACs)"
    return "a cloud split (run the model on rpi4/phone or the serving shim)"


def _verdict(g, profile, layers, need, weights, arena, train, strategy, latency_ms, split) -> tuple[str, bool]:
    where = "heap" if profile.runtime == "micropython" else ("arena" if profile.kind == "mcu" else "RAM budget")
    if not profile.budget_holds_weights and profile.flash_bytes and weights > profile.flash_bytes:
        return (f"does not fit: weights need {kb(weights)} of flash, {kb(weights - profile.flash_bytes)} over "
                f"its {kb(profile.flash_bytes)}; try {_variant_hint(g, profile, 0, 0)}", False)
    if need > profile.budget_bytes:
        worst = max(layers, key=lambda r: r["need_bytes"])
        over = need - profile.budget_bytes
        return (f"does not fit: layer {worst['index']} ({worst['op']}) needs {kb(worst['need_bytes'])}, "
                f"{kb(over)} over the {kb(profile.budget_bytes)} {where}; try "
                f"{_variant_hint(g, profile, need, latency_ms)} or a cloud split", False)
    if latency_ms > profile.max_latency_ms:
        return (f"too slow: {latency_ms:.0f} ms per window on {profile.name}, over its "
                f"{profile.max_latency_ms:.0f} ms budget; try {_variant_hint(g, profile, 0, latency_ms)}", False)
    text = (f"fits: {kb(need)} of {kb(profile.budget_bytes)} {where} "
            f"(weights {kb(weights)}{(' in heap' if profile.runtime == 'micropython' else ' in RAM') if profile.budget_holds_weights else ' in flash'}, "
            f"arena {kb(arena)}, {strategy} training {kb(train)}), {latency_ms:.1f} ms per window")
    if split is not None and split.cut == 0:
        text += "; cheaper still: send the input features to the cloud and run nothing here"
    elif split is not None and split.cut < len(g.layers):
        text += f"; cheapest split runs layers 0-{split.cut - 1} here and the rest in the cloud"
    return text, True
