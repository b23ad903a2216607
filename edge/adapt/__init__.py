"""On-device adaptation: the conv tail on the int8 backbone, and the embedding head.

Two things, two names: the *conv tail* is the end of the network (dw4, pw4, pool, classifier:
``tail.npz``) that ``device adapt`` trains; the *embedding head* is a projection + classifier on
the 64-d embedding (``head.npz`` in a federated bundle; ``edge.fl`` trains it in a round).

- ``conv`` / ``convtrain``: the network's real tail (float dw4 -> pw4 -> pool ->
  classifier from the bundle's ``tail.npz``) on the frozen int8 backbone, and its
  trainers (bias-only, adapter, LoRA, sparse, full; SGD/Adam; exact bytes). This is
  what ``edgelearn device adapt`` trains. ``fcache``: int8 backbone outputs cached;
  ``prefix``: the part of the tail no trained tensor changes, computed once per example;
  ``convreplay``: tail-input replay mixed into batches, prepared once per run.
- ``head``: the embedding head (``EmbeddingHead``: identity-initialised projection + the bundle's classifier on the
  64-d embedding), forward/backward, LoRA merge, classifier recovery from a bundle.
- ``trainer``: the embedding head's trainer: bias-only, residual adapter, LoRA, sparse (contribution analysis under
  a memory budget) and full updates with SGD or Adam, exact per-step byte accounting,
  replay mixing.
- ``strategies``: the strategy and optimiser names, once (trainers, partitioner, aggregator).
- ``store``: adapted parameters per context, versioned, rollback, pause checkpoints.
- ``run``: the pausable training loop the scheduler drives; ``sampling``: which local examples a
  step sees (plain order, or a share of negatives and class-balanced commands).
- ``recipe``, ``ambient``, ``verified``: speaker adaptation of the base commands (issue 17): the
  place's own audio as ``_unknown_``, augmented clips, and a second stage per command from the
  same clips (docs/edge-runtime.md, "Speaker adaptation").

    >>> from edge.adapt import ConvTail, ConvTrainer, load_tail
    >>> tr = ConvTrainer(ConvTail(load_tail(bundle), qparams=backbone.qparams), "bias-only")
    >>> tr.step(backbone_int8_features, labels)
"""

from edge.adapt.head import EmbeddingHead, classifier_from_bundle  # noqa: F401
from edge.adapt.trainer import STRATEGIES, Trainer, choose_sparse, mix_replay  # noqa: F401
from edge.adapt.conv import ConvTail, TailModel  # noqa: F401
from edge.adapt.convbundle import Backbone, load_tail  # noqa: F401
from edge.adapt.convtrain import ConvTrainer  # noqa: F401
