"""Per-op placement (NPU or CPU, with the failed constraint as the reason), Arm Vela
for the Ethos-U targets, and the Neurosurgeon-style device/cloud split.

    >>> place(graph, load_profile("ethos-u55"))[0]
    Placement(layer=0, engine='npu', reason='')
    >>> best_split(graph, load_profile("rpi4"), objective="latency").cut
    12

Vela is run as its own process (its CLI is its stable interface) and its per-layer
CSV is read back; ``vela_report`` returns MACs and NPU/CPU per original operator.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from host.partition.graph import POOL_OPS, Graph
from host.partition.profiles import Profile


@dataclass(frozen=True)
class Placement:
    layer: int
    engine: str
    reason: str = ""


def _npu_reason(g: Graph, layer, npu) -> str:
    """Empty string if the NPU takes this op, else the first constraint it fails."""
    if npu.ops and layer.op not in npu.ops:
        return f"{layer.op} is not in the NPU's int8 operator set"
    for t in layer.inputs + layer.outputs:
        if t >= 0 and not g.tensors[t].is_const and g.tensors[t].dtype not in ("int8", "int32", "int16"):
            if layer.op not in ("QUANTIZE", "DEQUANTIZE", "SHAPE"):
                return f"tensor {g.tensors[t].name!r} is {g.tensors[t].dtype}, the NPU runs int8 only"
    stride = layer.params.get("stride")
    out_shape = g.tensors[layer.outputs[0]].shape if layer.outputs else ()
    # Vela's rule: stride height counts only when the output has more than one row.
    if npu.max_stride and stride and layer.op not in POOL_OPS and max(stride) > npu.max_stride \
            and not (len(out_shape) == 4 and out_shape[1] == 1 and stride[1] <= npu.max_stride):
        return f"stride {stride[0]}x{stride[1]} exceeds the NPU limit of {npu.max_stride}"
    k = layer.params.get("kernel")
    if k and layer.op in ("CONV_2D", "DEPTHWISE_CONV_2D") and npu.max_kernel_hw:
        dil = layer.params.get("dilation", (1, 1))
        area = ((k[0] - 1) * dil[0] + 1) * ((k[1] - 1) * dil[1] + 1)
        if area > npu.max_kernel_hw:
            return f"kernel {k[0]}x{k[1]} (area {area}) exceeds the NPU limit of {npu.max_kernel_hw}"
    if k and layer.op in POOL_OPS and npu.max_pool_kernel_hw and layer.params.get("padding") == "SAME" \
            and k[0] * k[1] > npu.max_pool_kernel_hw:
        return f"pool kernel {k[0]}x{k[1]} with SAME padding exceeds the NPU limit of {npu.max_pool_kernel_hw}"
    return ""


def place(g: Graph, profile: Profile) -> list[Placement]:
    npu = profile.npu
    out = []
    for layer in g.layers:
        if npu is None:
            out.append(Placement(layer.index, "cpu", "target has no NPU"))
            continue
        reason = _npu_reason(g, layer, npu)
        out.append(Placement(layer.index, "cpu" if reason else "npu", reason))
    return out


def vela_available() -> bool:
    return _vela_exe() is not None


def _vela_exe() -> str | None:
    cand = Path(sys.executable).with_name("vela")
    return str(cand) if cand.exists() else shutil.which("vela")


def vela_report(tflite: Path, accelerator: str = "ethos-u55-128", keep_dir: Path | None = None) -> dict:
    """Compile with Vela; return {'macs', 'layers': [{name, op, target, macs}], 'cpu_ops', 'npu_ops'}.

    With ``keep_dir`` the compiled model (Ethos-U custom op + CPU fallback ops) is
    copied there and its path returned as 'compiled'.
    """
    exe = _vela_exe()
    if exe is None:
        from edge.errors import EdgelearnError
        raise EdgelearnError("Arm Vela is not installed", fix="pip install 'edgelearn[host]' (ethos-u-vela)")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([exe, str(tflite), "--accelerator-config", accelerator, "--output-dir", tmp, "--verbose-performance"],
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            from edge.errors import EdgelearnError
            raise EdgelearnError(f"vela failed on {tflite.name}: {res.stderr.strip().splitlines()[-1:]}",
                                 fix="check that the model is a full-integer int8 TFLite file")
        stem = Path(tflite).stem
        rows = list(csv.DictReader(open(Path(tmp) / f"{stem}_per-layer.csv")))
        summary = next(csv.DictReader(open(next(Path(tmp).glob(f"{stem}_summary_*.csv")))))
        compiled = None
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            compiled = keep_dir / f"{stem}_vela.tflite"
            shutil.copyfile(Path(tmp) / f"{stem}_vela.tflite", compiled)
    layers = [{"name": r["Name"], "op": r["Original Operator"], "nng_op": r["NNG Operator"],
               "target": r["Target"].lower(), "macs": int(r["MAC Count"])} for r in rows]
    def count(label: str) -> int:  # "CPU operators = 1 (4.8%)" in Vela's summary
        m = re.search(label + r" operators = (\d+)", res.stdout)
        return int(m.group(1)) if m else 0

    return {"macs": int(float(summary["nn_macs"])), "layers": layers, "compiled": compiled,
            "cpu_ops": count("CPU"), "npu_ops": count("NPU"),
            "warnings": [l for l in res.stdout.splitlines() if l.startswith("Warning")]}


@dataclass(frozen=True)
class Split:
    cut: int                 # layers [0, cut) run on the device, [cut, n) in the cloud
    latency_ms: float
    energy_mj: float
    device_macs: int
    tx_bytes: int


def split_costs(g: Graph, profile: Profile) -> list[Split]:
    """Cost of every cut (Neurosurgeon, Kang et al. 2017): device compute + uplink + RTT.

    The cloud's compute is taken as free next to the uplink (a server runs a 5 M-MAC
    model in well under a millisecond); cut = n means "all on the device".
    """
    eng = profile.npu or profile.cpu
    n = len(g.layers)
    input_bytes = sum(g.tensors[t].nbytes for t in g.inputs)
    out = []
    for cut in range(n + 1):
        macs = sum(l.macs for l in g.layers[:cut])
        if cut == n:
            tx = 0
        elif cut == 0:
            tx = input_bytes
        else:
            tx = _boundary_bytes(g, cut)
        compute_s = macs / eng.macs_per_s
        link_s = (tx / profile.uplink_bytes_per_s + profile.rtt_ms / 1000) if tx else 0.0
        energy = macs * eng.energy_pj_per_mac * 1e-9 + tx * profile.tx_energy_nj_per_byte * 1e-6
        out.append(Split(cut, (compute_s + link_s) * 1000, energy, macs, tx))
    return out


def _boundary_bytes(g: Graph, cut: int) -> int:
    """Bytes of tensors produced before the cut and consumed after it."""
    produced = {t for l in g.layers[:cut] for t in l.outputs} | set(g.inputs)
    needed = {t for l in g.layers[cut:] for t in l.inputs if t >= 0} | set(g.outputs)
    return sum(g.tensors[t].nbytes for t in produced & needed if not g.tensors[t].is_const)


def best_split(g: Graph, profile: Profile, objective: str = "latency") -> Split:
    if objective not in ("latency", "energy"):
        raise ValueError("objective must be 'latency' or 'energy'")
    costs = split_costs(g, profile)
    key = (lambda s: (s.latency_ms, -s.cut)) if objective == "latency" else (lambda s: (s.energy_mj, -s.cut))
    return min(costs, key=key)
