"""A minimal MLServer runtime for ONNX Runtime, the reference in bench/serve_*.py.

Not a benchmark itself (hence the leading underscore); it runs inside MLServer's
own virtualenv (.venv-mlserver), never imported by the project.

MLServer ships no ONNX runtime of its own; this is the smallest faithful one:
one session per worker with one intra-op thread (as the edgelearn replicas),
inputs decoded and outputs encoded with MLServer's own NumpyCodec.

    model-settings.json: {"name": "kws", "implementation": "_mlserver_onnx.OnnxRuntimeModel",
                          "parameters": {"uri": "/path/model.onnx"}}
"""

from __future__ import annotations

import time

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._sess = ort.InferenceSession(self.settings.parameters.uri, opts, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._sess.get_outputs()]
        extra = self.settings.parameters.extra or {}
        # Emulated model cost (bench/serve_overload.py), the same as edgelearn's fault-injection delay.
        self._delay = float(extra.get("delay_ms", 0.0)) / 1000.0
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        if self._delay:
            time.sleep(self._delay)  # blocks the worker like compute would
        results = self._sess.run(self._outputs, feeds)
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._outputs, results)])
