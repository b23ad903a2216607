"""edgelearn host toolchain: corpus, training, quantisation, partitioning, bundles, services.

Heavy dependencies (TensorFlow, librosa, ONNX) are imported inside functions,
never at module top level, so importing ``host`` stays cheap.
"""
