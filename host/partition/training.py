"""Training memory of on-device adaptation, per strategy and optimiser.

The frozen int8 backbone runs as inference; only the *trainable tail* (by default
the last pointwise convolution, the pooling and the dense layers) trains, in
float32. For one forward + backward + update step this module predicts the bytes
of: trainable float32 parameters, their gradients, optimiser state (SGD: none,
Adam: two moments), activations stored for the backward pass, and the backward
workspace (the largest ``dy`` + ``dx`` pair alive at once).

    >>> from host.partition.graph import load_graph
    >>> tail = tail_ops(load_graph("encoder_int8.tflite"))
    >>> training_memory(tail, "bias-only", "sgd").total, training_memory(tail, "full", "sgd").total
    (1168, 111776)

Strategies (Cai et al., TinyTL 2020; Hu et al., LoRA 2021; Houlsby et al. 2019;
Lin et al., MCUNetV3 sparse update 2022):

* ``full``: every tail weight and bias; stores each linear layer's input.
* ``bias-only``: biases only; a bias gradient is just ``dy``, so no layer input is
  stored - only the 1-byte ReLU masks. This is TinyTL's memory saving.
* ``lora``: rank-r ``A`` (cin x r), ``B`` (r x cout) beside each frozen weight;
  stores the layer input and ``x @ A``.
* ``residual-adapter``: ``z = y + relu(y @ A) @ B`` (bottleneck r) after each
  linear layer; stores ``y``, ``relu(y @ A)`` and its mask.
* ``sparse``: weights and biases of the chosen layers (default: the last),
  biases elsewhere.

ReLU masks are stored as one byte per element (numpy ``bool``; the MicroPython
trainer uses a ``bytearray``). The device trainers of the edge runtime report
what they measured through ``check_measured`` so every prediction stays honest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edge.adapt.strategies import OPTIMIZERS, STRATEGIES as _NAMES
from host.partition.graph import Graph, ModelError

# the report order: full (the baseline) first, then the registry's order
STRATEGIES = ("full",) + tuple(s for s in _NAMES if s != "full")
F32 = 4
# Layers the tail may contain; a depthwise or k x k convolution ends it (their
# backward pass needs im2col workspaces this model does not describe).
_VIEW_OPS = {"RESHAPE", "SHAPE", "STRIDED_SLICE", "PACK", "SQUEEZE", "DEQUANTIZE", "QUANTIZE"}


@dataclass(frozen=True)
class TailOp:
    kind: str          # "linear" or "pool"
    layer: int         # index in the graph
    name: str
    positions: int     # spatial positions P (1 for a dense layer)
    cin: int
    cout: int
    relu: bool


@dataclass(frozen=True)
class TrainingMemory:
    strategy: str
    optimizer: str
    params: int
    grads: int
    optimizer_state: int
    activations: int
    workspace: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_state + self.activations + self.workspace

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def tail_ops(g: Graph, n_weighted: int = 3) -> list[TailOp]:
    """The trainable tail: the last ``n_weighted`` weighted layers and the pooling between them."""
    ops: list[TailOp] = []
    weighted = 0
    nchw = g.format == "onnx"

    def hw_c(shape: tuple) -> tuple[int, int]:
        """(spatial positions, channels) of a 4-D activation in the model's layout."""
        if nchw:
            return int(shape[2] * shape[3]), int(shape[1])
        return int(shape[1] * shape[2]), int(shape[3])

    for layer in reversed(g.layers):
        if weighted >= n_weighted:
            break
        out = g.tensors[layer.outputs[0]]
        if layer.op in _VIEW_OPS or layer.op in ("SOFTMAX",):
            continue
        inp = g.tensors[layer.inputs[0]]
        relu = layer.params.get("activation") in ("RELU", "RELU6")
        if layer.op == "FULLY_CONNECTED":
            w = g.tensors[layer.inputs[1]].shape  # TFLite (N, K); ONNX MatMul (K, N)
            cin, cout = (w[0] if nchw else w[-1]), out.shape[-1]
            ops.append(TailOp("linear", layer.index, layer.name, 1, cin, cout, relu))
            weighted += 1
        elif layer.op == "CONV_2D" and layer.params.get("kernel") == (1, 1) \
                and layer.params.get("stride") == (1, 1):
            (positions, cout), (_, cin) = hw_c(out.shape), hw_c(inp.shape)
            ops.append(TailOp("linear", layer.index, layer.name, positions, cin, cout, relu))
            weighted += 1
        elif layer.op in ("AVERAGE_POOL_2D", "MEAN") and len(inp.shape) == 4:
            positions, c = hw_c(inp.shape)
            ops.append(TailOp("pool", layer.index, layer.name, positions, c, c, False))
        else:
            break
    ops.reverse()
    if not any(o.kind == "linear" for o in ops):
        last = g.layers[-1] if g.layers else None
        raise ModelError(f"{g.path.name}: no trainable tail (the last layers end in "
                         f"{last.op if last else 'nothing'}, not dense or 1x1 convolution layers)",
                         fix="end the model with a dense embedding and classifier, as DS-CNN does")
    return ops


def _trainable(op: TailOp, strategy: str, rank: int, chosen: bool) -> int:
    if op.kind != "linear":
        return 0
    if strategy == "full" or (strategy == "sparse" and chosen):
        return op.cin * op.cout + op.cout
    if strategy in ("bias-only", "sparse"):
        return op.cout
    if strategy == "lora":
        return rank * (op.cin + op.cout)
    return 2 * rank * op.cout  # residual adapter: A (cout x r) and B (r x cout)


def _collapses(ops: list[TailOp], i: int, strategy: str, chosen: bool) -> bool:
    """A bias-only linear op right before a global average pool never needs its dy map.

    Its gradient reaching the pool output is g (C values); dy[p, c] = mask[p, c] * g[c] / P,
    so the bias gradient is g[c] * count_p(mask[p, c]) / P: per-channel counts replace the
    P x C mask and the P x C dy is never built (TinyTL's "lite" activations).
    """
    nxt = ops[i + 1] if i + 1 < len(ops) else None
    bias_only = strategy == "bias-only" or (strategy == "sparse" and not chosen)
    return bias_only and ops[i].kind == "linear" and nxt is not None and nxt.kind == "pool" and i == 0


def _stored(ops: list[TailOp], i: int, strategy: str, rank: int, chosen: bool) -> int:
    op = ops[i]
    if op.kind != "linear":
        return 0
    p = op.positions
    if _collapses(ops, i, strategy, chosen):
        return op.cout * F32 if op.relu else 0  # active-position counts per channel
    mask = p * op.cout if op.relu else 0
    if strategy == "full" or (strategy == "sparse" and chosen):
        return p * op.cin * F32 + mask
    if strategy in ("bias-only", "sparse"):
        return mask
    if strategy == "lora":
        return p * op.cin * F32 + p * rank * F32 + mask
    return p * op.cout * F32 + p * rank * F32 + p * rank + mask


def training_memory(ops: list[TailOp], strategy: str, optimizer: str = "sgd", rank: int = 4,
                    sparse_layers: tuple[int, ...] | None = None) -> TrainingMemory:
    """Bytes a training step needs beyond inference.

    The forward pass is inference: it runs in the arena ``plan_arena`` sizes, and
    hands the trainer only the tensors it asked to keep. Beyond that a step holds the
    trainable float32 parameters, gradients and optimiser state, the kept tensors, and
    the backward working set: one ``dy`` and one ``dx`` (plus rank-sized temporaries for
    LoRA/adapters) at a time, with kept tensors freed as backward passes them. The
    update runs in place (SGD: ``g *= lr; p -= g``); Adam needs one temporary the size
    of the largest trainable array. The numpy reference trainer in
    ``tests/test_partition_training.py`` is this recipe, measured with tracemalloc.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {STRATEGIES}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r} is not one of {OPTIMIZERS}")
    linear = [o for o in ops if o.kind == "linear"]
    chosen = set(sparse_layers) if sparse_layers is not None else {linear[-1].layer}
    n = sum(_trainable(o, strategy, rank, o.layer in chosen) for o in ops)
    stored = [_stored(ops, i, strategy, rank, o.layer in chosen) for i, o in enumerate(ops)]
    saved, work = sum(stored), 0
    for i in range(len(ops) - 1, -1, -1):
        o, p = ops[i], ops[i].positions
        pooled_next = i + 1 < len(ops) and ops[i + 1].kind == "pool" and i == 0 \
            and _collapses(ops, i, strategy, o.layer in chosen)
        if o.kind == "pool":
            # dx of a pool feeding a collapsed op stays a C-vector
            dy, dx = o.cout * F32, (0 if i == 0 or _collapses(ops, i - 1, strategy, ops[i - 1].layer in chosen)
                                    else p * o.cin * F32)
        else:
            dy = o.cout * F32 if pooled_next else p * o.cout * F32
            dx = p * o.cin * F32 if i > 0 else 0
        extra = 0
        if o.kind == "linear" and strategy == "lora":
            extra = p * rank * F32 + dx
        elif o.kind == "linear" and strategy == "residual-adapter":
            extra = p * rank * F32 + p * o.cout * F32
        work = max(work, saved + dy + dx + extra - sum(stored))
        saved -= stored[i]
    if optimizer == "adam":
        largest = max((_largest_array(o, strategy, rank, o.layer in chosen) for o in linear), default=0)
        work = max(work, largest * F32)
    opt_state = 2 * n * F32 if optimizer == "adam" else 0
    return TrainingMemory(strategy, optimizer, n * F32, n * F32, opt_state, sum(stored), work)


def _largest_array(o: TailOp, strategy: str, rank: int, chosen: bool) -> int:
    if strategy == "full" or (strategy == "sparse" and chosen):
        return o.cin * o.cout
    if strategy in ("bias-only", "sparse"):
        return o.cout
    if strategy == "lora":
        return rank * max(o.cin, o.cout)
    return rank * o.cout


def all_strategies(ops: list[TailOp], optimizer: str = "sgd", rank: int = 4) -> dict[str, TrainingMemory]:
    return {s: training_memory(ops, s, optimizer, rank) for s in STRATEGIES}


def check_measured(predicted: dict[str, TrainingMemory], measured: dict[str, int],
                   tolerance: float = 0.10) -> list[dict]:
    """Hook for device trainers: compare measured peak bytes per strategy with the prediction.

    ``measured`` maps a strategy name to the peak bytes a trainer allocated for one
    step (tracemalloc on CPython, ``gc.mem_alloc()`` deltas on MicroPython). Returns
    one row per strategy with the ratio and whether it is within ``tolerance``.
    """
    rows = []
    for name, got in measured.items():
        if name not in predicted:
            raise ValueError(f"measured strategy {name!r} has no prediction (have: {sorted(predicted)})")
        want = predicted[name].total
        ratio = got / want if want else float("inf")
        rows.append({"strategy": name, "predicted": want, "measured": int(got), "ratio": ratio,
                     "ok": abs(ratio - 1.0) <= tolerance})
    return rows
