"""Run the MCU model variant from its int8 tensor blob: the board's inference engine.

The model is data (as emlearn does it): ``weights.elb`` (the partitioner's
flat tensor blob, docs/partition.md) holds the int8 weights and int32 biases,
``graph.json`` (written by ``host/mcu_model.py``, docs/firmware.md) the op
list with shapes, options and activation quantisation. ``McuModel`` builds one
``edge.portable.kernels`` layer per op and one preallocated ``array('b')``
per activation at load time; ``invoke()`` then allocates nothing that lasts.
A blob that does not carry what the graph needs (another model, another
version, a truncated file) is a ``ModelBlobError`` before anything runs.
Reading the blob and the graph is ``edge.portable.model_load``, a separate
module so a board can drop its code once the model is built.

    from edge.portable.model import McuModel
    m = McuModel("weights.elb", "graph.json")
    m.set_input(normalised_features)     # 490 floats, (49, 10) row-major
    m.invoke()
    m.embedding, m.logits                # array('b'); m.embedding_f(out) dequantises
"""

from edge.portable import kernels as K


class ModelBlobError(ValueError):
    """The blob or graph is unreadable or does not belong together; ``fix`` says what to do."""

    def __init__(self, problem, fix="deploy the weights.elb and graph.json of one bundle (edgelearn flash --bundle ...)"):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class McuModel:
    """The int8 graph of ``graph.json`` with weights from ``weights.elb``."""

    def __init__(self, blob_path, graph_path):
        from edge.portable.model_load import build
        build(self, blob_path, graph_path)

    def set_input(self, feats):
        """Quantise ``len(input)`` normalised float features into the input tensor."""
        K.quantize_input(feats, self.input_scale, self.input_zp, self.input)

    def invoke(self):
        for layer, src, out in self.layers:
            layer.run(src, out)

    def embedding_f(self, out):
        """The embedding dequantised into ``out`` (array('f'))."""
        s, z = self.embedding_q
        e = self.embedding
        for i in range(len(e)):
            out[i] = (e[i] - z) * s
        return out

    def probs(self, out):
        """Softmax of the logits into ``out`` (array('f'))."""
        s, z = self.logits_q
        return K.softmax(self.logits, s, z, out)
