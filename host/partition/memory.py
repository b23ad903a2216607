"""Peak activation arena, planned the way TensorFlow Lite Micro plans it.

TFLM splits its arena in two (micro_allocator.cc): the *head* holds the
non-persistent buffers (activations and kernel scratch), placed by
``GreedyMemoryPlanner``; the *tail* holds persistent allocations made once at
start-up (per-tensor ``TfLiteEvalTensor`` structs, per-node structs and parsed
options, each kernel's ``OpData`` and per-channel requantisation arrays, and the
allocator's own objects). ``plan_arena`` reproduces both.

    >>> from host.partition.graph import load_graph
    >>> plan = plan_arena(load_graph("model.tflite"))
    >>> plan.head_bytes, plan.tail_bytes, plan.arena_bytes
    (16000, 8416, 24416)

Head: exactly TFLM's algorithm (greedy_memory_planner.cc, micro_allocation_info.cc):
every non-constant tensor is a buffer whose size is rounded up to 16 bytes
(kBufferAlignment); graph inputs are born at scope 0, op ``i`` runs at scope
``i + 1``, an op's inputs and outputs are alive in the same scope (no in-place),
graph outputs live to the end; buffers are sorted by size, largest first (a
stable sort), and each is put in the lowest gap that no time-overlapping buffer
occupies.

Tail: a model from the model's own counts, no fitting to any model being checked.
The sizes of TFLM's structs were read off its RecordingMicroAllocator for one-op
probe models (docs/partition.md lists the probes and how to rerun them; the
numbers below are for the 64-bit x86 ``tflite-micro`` wheel with reference
kernels - a 32-bit MCU build has smaller pointers, so this over-estimates it):

* 712 bytes fixed: the allocator objects, the subgraph tables, and the
  persistent ``TfLiteTensor`` + quantisation structs of one input and one output;
  96 more for every further graph input/output.
* 24 bytes per tensor (``sizeof(TfLiteEvalTensor)`` on LP64).
* per operator: 64 bytes of ``NodeAndRegistration`` plus its parsed builtin
  options and kernel ``OpData`` (table ``_OP_PERSISTENT``), plus 8 bytes per output
  channel for per-channel quantised CONV/DEPTHWISE/FULLY_CONNECTED (int32
  multiplier + int32 shift arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from host.partition.graph import Graph

ALIGN = 16  # TFLM MicroArenaBufferAlignment()

_FIXED_TAIL = 712
_PER_EXTRA_IO = 96
_PER_TENSOR = 24
# NodeAndRegistration (64) + builtin options + OpData, measured per kernel with one-op probes.
_OP_PERSISTENT = {
    "CONV_2D": 184, "DEPTHWISE_CONV_2D": 184, "FULLY_CONNECTED": 176,
    "AVERAGE_POOL_2D": 136, "MAX_POOL_2D": 136, "SOFTMAX": 152, "CONCATENATION": 152,
    "MEAN": 128, "PAD": 112, "LOGISTIC": 72,
    "SHAPE": 104, "STRIDED_SLICE": 104, "PACK": 104, "RESHAPE": 104,
}
# Ops not probed get the median of the table; the report marks the arena as approximate.
_OP_DEFAULT = 136
_PER_CHANNEL_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass
class Buffer:
    tensor: int
    size: int
    first: int
    last: int
    offset: int = -1


@dataclass
class ArenaPlan:
    head_bytes: int
    tail_bytes: int
    buffers: list[Buffer]
    per_layer_live: list[int]          # bytes of activations alive while layer i runs
    approximate_ops: list[str] = field(default_factory=list)

    @property
    def arena_bytes(self) -> int:
        return self.head_bytes + self.tail_bytes


def lifetimes(g: Graph) -> list[Buffer]:
    """Buffers with TFLM's allocation scopes (micro_allocation_info.cc)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t in g.inputs + g.outputs:
        first[t], last[t] = 0, 0
    for i, layer in enumerate(g.layers):
        scope = i + 1
        for t in layer.outputs:
            first[t] = scope
            last[t] = scope
        for t in layer.inputs:
            if t >= 0:
                last[t] = scope
    end = len(g.layers)
    for t in g.outputs:
        last[t] = end
    bufs = []
    for t in sorted(first):  # TFLM adds buffers in tensor-index order
        tensor = g.tensors[t]
        if tensor.is_const or tensor.nbytes == 0:
            continue
        bufs.append(Buffer(t, align(tensor.nbytes), first[t], last.get(t, first[t])))
    return bufs


def greedy_plan(bufs: list[Buffer]) -> int:
    """Place buffers as GreedyMemoryPlanner does; returns the high-water mark in bytes.

    Written here rather than imported because TFLM's planner is C++ only; it is
    ~20 lines and the test checks it byte-for-byte against the real interpreter.
    """
    order = sorted(range(len(bufs)), key=lambda i: -bufs[i].size)  # stable, like ReverseSortInPlace
    placed: list[Buffer] = []  # kept sorted by offset
    for i in order:
        b = bufs[i]
        candidate = 0
        for other in placed:
            if other.first > b.last or b.first > other.last:
                continue  # not alive at the same time
            if other.offset - candidate >= b.size:
                break     # the gap before this buffer is big enough
            candidate = max(candidate, other.offset + other.size)
        b.offset = candidate
        placed.append(b)
        placed.sort(key=lambda x: x.offset)
    return max((b.offset + b.size for b in bufs), default=0)


def tail_bytes(g: Graph) -> tuple[int, list[str]]:
    io = len(set(g.inputs)) + len(set(g.outputs))
    total = _FIXED_TAIL + _PER_EXTRA_IO * max(0, io - 2) + _PER_TENSOR * len(g.tensors)
    unknown = []
    for layer in g.layers:
        if layer.op in _OP_PERSISTENT:
            total += _OP_PERSISTENT[layer.op]
        else:
            total += _OP_DEFAULT
            unknown.append(layer.op)
        if layer.op in _PER_CHANNEL_OPS and len(layer.inputs) > 1:
            scales = g.tensors[layer.inputs[1]].scales
            if len(scales) > 1:
                total += 8 * len(scales)
    return total, sorted(set(unknown))


def plan_arena(g: Graph) -> ArenaPlan:
    bufs = lifetimes(g)
    head = greedy_plan(bufs)
    live = []
    for i in range(len(g.layers)):
        scope = i + 1
        live.append(sum(b.size for b in bufs if b.first <= scope <= b.last))
    tail, unknown = tail_bytes(g)
    return ArenaPlan(head, tail, bufs, live, unknown)
