"""The on-device adaptation strategies and optimisers, by name: the one list.

The trainers (``edge.adapt.trainer``, ``edge.adapt.convtrain``), the partitioner's
training-memory model (``host.partition.training``) and the aggregator's
``adapt_strategy`` setting (``host.aggregator.config``) all read these names.

* ``bias-only``: biases only (TinyTL, Cai et al. 2020).
* ``residual-adapter``: a bottleneck adapter after the trained layers (Houlsby et al. 2019).
* ``lora``: rank-r ``A``/``B`` beside each frozen weight (Hu et al. 2021).
* ``sparse``: the most useful tensors under a memory budget, the rest bias-only.
* ``full``: every weight and bias of the tail.
"""

STRATEGIES = ("bias-only", "residual-adapter", "lora", "sparse", "full")
OPTIMIZERS = ("sgd", "adam")
