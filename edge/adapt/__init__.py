"""On-device adaptation of the trainable tail on top of the frozen int8 encoder.

- ``tail``: the tail (identity-initialised projection + the bundle's classifier on the
  64-d embedding), forward/backward, LoRA merge, classifier recovery from a bundle.
- ``trainer``: bias-only, residual adapter, LoRA, sparse (contribution analysis under
  a memory budget) and full updates with SGD or Adam, exact per-step byte accounting,
  replay mixing.
- ``store``: adapted parameters per context, versioned, rollback, pause checkpoints.
- ``run``: the pausable training loop the scheduler drives.

    >>> from edge.adapt import Tail, Trainer, classifier_from_bundle
    >>> tr = Trainer(Tail(classifier_from_bundle(bundle)), "bias-only")
    >>> tr.step(embeddings, labels)
"""

from edge.adapt.tail import Tail, classifier_from_bundle  # noqa: F401
from edge.adapt.trainer import STRATEGIES, Trainer, choose_sparse, mix_replay  # noqa: F401
