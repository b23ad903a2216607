"""TFLite Micro on the host (PyPI ``tflite-micro``): what an MCU's interpreter computes.

Host-only: it checks that an int8 model runs under TFLM's kernels and op set
and agrees with LiteRT, and measures the tensor arena an MCU must reserve.
TFLM needs the arena size up front; too small raises (or, for some models and
versions, aborts the whole process), so the default here is generous and
``probe_arena_size`` finds the minimum by trying sizes in child processes.
TFLM runs one example at a time, so batches are looped.

    >>> from edge.backends import load
    >>> from edge.backends.tflite_micro import probe_arena_size
    >>> m = load("encoder_int8.tflite", backend="tflite_micro")     # 1 MiB + 4x model arena
    >>> probe_arena_size("encoder_int8.tflite")                      # e.g. 23104 (bytes)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from edge.backends import Backend, BackendUnavailable, TensorInfo
from edge.errors import EdgelearnError

PIP_NAME = "tflite-micro"
MIN_DEFAULT_ARENA = 1 << 20


def check_available():
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError as e:
        raise BackendUnavailable(f"backend 'tflite_micro' needs the package {PIP_NAME} (host only, x86_64) ({e})",
                                 fix=f"`pip install {PIP_NAME}` on the host; devices use 'litert'") from None
    return runtime


def default_arena_size(model_bytes: int) -> int:
    # Activations of a small int8 CNN are a fraction of its weights; 4x the
    # flatbuffer plus 1 MiB leaves room for per-channel quantisation data and
    # scratch buffers of any model this project ships.
    return MIN_DEFAULT_ARENA + 4 * model_bytes


def _tensor_names(model_data: bytes):
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema_fb

    sub = schema_fb.Model.GetRootAsModel(model_data, 0).Subgraphs(0)
    if sub is None:
        raise ValueError("the model has no subgraph")

    def name(idx: int) -> str:
        t = sub.Tensors(idx)
        raw = t.Name() if t is not None else None
        return raw.decode("utf-8", "replace") if raw else f"tensor{idx}"
    return ([name(sub.Inputs(i)) for i in range(sub.InputsLength())],
            [name(sub.Outputs(i)) for i in range(sub.OutputsLength())])


def _info(name: str, d: dict) -> TensorInfo:
    q = d.get("quantization_parameters") or {}
    scales, zps = q.get("scales", []), q.get("zero_points", [])
    return TensorInfo(name, tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"]),
                      float(scales[0]) if len(scales) else 0.0, int(zps[0]) if len(zps) else 0)


class TFLiteMicroBackend(Backend):
    name = "tflite_micro"

    def __init__(self, path: Path, arena_size: int | None = None):
        runtime = check_available()
        self.path = path
        data = path.read_bytes()
        self.arena_size = int(arena_size) if arena_size is not None else default_arena_size(len(data))
        try:
            in_names, out_names = _tensor_names(data)
            self._it = runtime.Interpreter.from_bytes(data, arena_size=self.arena_size)
        except RuntimeError as e:
            raise EdgelearnError(f"{path.name}: TFLite Micro could not allocate tensors in a {self.arena_size}-byte arena ({e})",
                                 fix="pass a larger arena_size, or find the minimum with probe_arena_size()") from None
        except Exception as e:  # a flatbuffer that does not parse raises from the generated schema code
            raise EdgelearnError(f"{path.name}: TFLite Micro cannot read it ({type(e).__name__}: {e})",
                                 fix="check it is a valid int8 .tflite") from None
        self.inputs = [_info(n, self._it.get_input_details(i)) for i, n in enumerate(in_names)]
        self.outputs = [_info(n, self._it.get_output_details(i)) for i, n in enumerate(out_names)]

    def _invoke_one(self, arrays):
        for i, a in enumerate(arrays):
            self._it.set_input(a, i)
        self._it.invoke()
        return [np.array(self._it.get_output(i), copy=True) for i in range(len(self.outputs))]


def open_model(path, num_threads: int = 1, arena_size: int | None = None, **options):
    """``num_threads`` is accepted for a uniform call but TFLM is single-threaded."""
    if options:
        raise EdgelearnError(f"backend 'tflite_micro' takes no options {sorted(options)}", fix="use arena_size= only")
    return TFLiteMicroBackend(Path(path), arena_size)


_CHILD = """
import sys, numpy as np
from tflite_micro.python.tflite_micro import runtime
it = runtime.Interpreter.from_file(sys.argv[1], arena_size=int(sys.argv[2]))
i = 0
while True:
    try:
        d = it.get_input_details(i)
    except Exception:
        break
    it.set_input(np.zeros(d["shape"], d["dtype"]), i)
    i += 1
it.invoke()
sys.stderr.flush()
if sys.argv[3] == "1":
    it.print_allocations()
"""


def _trial(model: Path, arena: int, report: bool = False, timeout: float = 120):
    res = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(arena), "1" if report else "0"],
                         capture_output=True, text=True, timeout=timeout)
    return res.returncode == 0, res.stderr


def probe_arena_size(model_path, max_arena: int | None = None) -> int:
    """The smallest arena (bytes) in which the model allocates and runs one inference under TFLM.

    Every trial runs in a child process, because a too-small arena can abort
    the interpreter's process. TFLM's own allocation report gives the first
    guess; a bisection confirms it (or searches if the report is off).
    """
    check_available()
    model = Path(model_path)
    if not model.is_file():
        raise EdgelearnError(f"{model}: model file not found", fix="check the path")
    hi = int(max_arena or default_arena_size(model.stat().st_size))
    ok, err = _trial(model, hi, report=True)
    if not ok:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise EdgelearnError(f"{model.name}: does not run under TFLite Micro even with a {hi}-byte arena ({last})",
                             fix="check the model uses only TFLM-supported int8 ops, or pass a larger max_arena")
    m = re.search(r"Arena allocation total (\d+) bytes", err)
    lo = 0  # largest size known to fail
    if m:
        guess = int(m.group(1))
        if guess < hi and _trial(model, guess)[0]:
            hi = guess
            if not _trial(model, guess - 1)[0]:
                return guess
        else:
            lo = min(guess, hi - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _trial(model, mid)[0]:
            hi = mid
        else:
            lo = mid
    return hi
