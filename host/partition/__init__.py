"""The partitioner: will this model fit that target, how will it run there, and what
trains on the device. Reads int8 .tflite / .onnx models and TOML target profiles.

    >>> from host.partition import load_graph, load_profile, plan_partition
    >>> plan = plan_partition(load_graph("models/kws-dscnn-s/encoder_int8.tflite"), load_profile("esp32"))
    >>> plan.verdict
    'fits: 62 KB of 100 KB heap (weights 27 KB, arena 25 KB, bias-only training 9 KB)'
"""

from host.partition.graph import Graph, Layer, ModelError, load_graph
from host.partition.profiles import Profile, ProfileError, load_profile

__all__ = ["Graph", "Layer", "ModelError", "load_graph", "Profile", "ProfileError", "load_profile",
           "plan_partition"]


def plan_partition(*args, **kwargs):
    from host.partition.plan import plan_partition as _plan
    return _plan(*args, **kwargs)
