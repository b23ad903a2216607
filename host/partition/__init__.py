"""The partitioner: will this model fit that target, how will it run there, and what
trains on the device. Reads int8 .tflite / .onnx models and TOML target profiles.

    >>> from host.partition import load_graph, load_profile, plan_partition
    >>> plan = plan_partition(load_graph("models/kws-dscnn-s/encoder_int8.tflite"), load_profile("esp32"))
    >>> plan.verdict
    'too slow: 6662 ms per window on esp32, over its 1000 ms budget; try the c24_b3 DS-CNN variant (~14% of the MACs)'
"""

from host.partition.graph import Graph, Layer, ModelError, load_graph
from host.partition.profiles import Profile, ProfileError, load_profile

__all__ = ["Graph", "Layer", "ModelError", "load_graph", "Profile", "ProfileError", "load_profile",
           "plan_partition"]


def plan_partition(*args, **kwargs):
    from host.partition.plan import plan_partition as _plan
    return _plan(*args, **kwargs)
