"""The federated model on a device: ``edge.adapt``'s trainable tail on the frozen encoder's
embedding, as the bundle's ``head.npz`` carries it; its logits, its local training, reading it.

    head = load_head(bundle)                                    # {"proj.w": ..., "classifier.b": ...}
    new = FederatedHeadTrainer("bias-only").train(head, X, y, task, rng)  # the tensors it changed
    R = load_rehearsal(bundle, head)    # (X, y) the aggregator ships beside the head, or None
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

HEAD_FILE = "head.npz"
REHEARSAL_FILE = "rehearsal.npz"


def head_logits(params: dict, X: np.ndarray) -> np.ndarray:
    """Logits of the federated tail (``edge.adapt.EmbeddingHead`` parameters: proj.*, classifier.*) on embeddings X."""
    from edge.adapt.head import EmbeddingHead

    return EmbeddingHead(params).forward(np.asarray(X, np.float32))[0]


class FederatedHeadTrainer:
    """Local training with ``edge.adapt.Trainer``; FedProx's proximal term is its decay-to-base.

    ``strategy`` (bias-only, lora, sparse, full, residual-adapter when the federated
    model carries adapter tensors) can be overridden per task (``adapt_strategy``).
    ``train(params, X, y, config, rng)`` returns the new values of the tensors it changed.

    ``negatives`` / ``negative_share`` / ``balance``: the speaker recipe's sampling
    (``edge.adapt.sampling.Batches``): that share of every batch from the negative labels
    (``_unknown_``, ``_silence_``), the rest class-balanced; as many steps per epoch as the plain
    walk. None (the default): one permutation per epoch, as before.
    ``tensors``: the tensors a ``sparse`` strategy trains when the task names none (e.g. the
    classifier alone). ``keep_absent``: the classifier's outputs for labels the device has no
    example of keep their weights (a device that hears 10 commands says nothing about the other
    words the shipped head knows; left free, every local step pushes them down).
    """

    def __init__(self, strategy: str = "full", optimizer: str = "sgd", negatives=(),
                 negative_share: float | None = None, balance: bool = False, tensors=None,
                 keep_absent: bool = False):
        self.strategy, self.optimizer = strategy, optimizer
        self.negatives, self.negative_share, self.balance = tuple(negatives), negative_share, bool(balance)
        self.tensors, self.keep_absent = (list(tensors) if tensors else None), bool(keep_absent)

    def train(self, params: dict, X, y, config: dict, rng) -> dict:
        from edge.adapt import EmbeddingHead, Trainer

        X = np.asarray(X, np.float32)
        y = np.asarray(y, np.int64)
        tail = EmbeddingHead({k: v.copy() for k, v in params.items()})
        tr = Trainer(tail, config.get("adapt_strategy", self.strategy), optimizer=self.optimizer,
                     lr=float(config.get("learning_rate", 0.1)), rank=int(config.get("rank", 4)),
                     seed=int(rng.integers(1 << 31)), sparse_tensors=config.get("sparse_tensors") or self.tensors,
                     weight_decay_to_base=float(config.get("prox_mu", 0.0)))
        step = tr.step
        if self.keep_absent:
            absent = np.setdiff1d(np.arange(params["classifier.b"].shape[0]), y)

            def step(xb, yb):
                tr.step(xb, yb)
                for k in ("classifier.w", "classifier.b"):
                    if k in tail.delta and tail.delta[k].shape == params[k].shape:
                        tail.delta[k][..., absent] = params[k][..., absent]
        bs = max(1, int(config.get("batch_size", 16)))
        epochs = int(config.get("local_epochs", 1))
        if self.negative_share is not None or self.balance:
            from edge.adapt.sampling import Batches

            batches = Batches(y, bs, seed=int(rng.integers(1 << 31)), balance=self.balance,
                              negatives=self.negatives, negative_share=self.negative_share)
            for i in range(epochs * -(-len(y) // bs)):
                idx = batches(i)
                step(X[idx], y[idx])
        else:
            for _ in range(epochs):
                order = rng.permutation(len(y))
                for a in range(0, len(y), bs):
                    step(X[order[a:a + bs]], y[order[a:a + bs]])
        merged = tail.merged()
        return {k: np.asarray(v, np.float32) for k, v in merged.items() if k in params}


def load_head(bundle) -> dict:
    """The trainable tensors a bundle carries in ``head.npz`` (named by manifest ``trainable.file``)."""
    name = bundle.manifest.get("trainable", {}).get("file", HEAD_FILE)
    try:
        with np.load(bundle.path(name)) as z:
            return {k: z[k].astype(np.float32) for k in z.files}
    except (OSError, ValueError, KeyError) as e:
        raise EdgelearnError(f"bundle v{bundle.version} has no readable {name} ({e})",
                             fix="this bundle carries no federated head; install one from the aggregator") from None


def load_rehearsal(bundle, head: dict):
    """The rehearsal set a version's bundle carries (``rehearsal.npz``, named by manifest
    ``extra.rehearsal.file``): embeddings ``X`` (N, D) and label ids ``y`` of the voices the shipped
    model was trained on, which the operator's aggregator ships with every version so that each
    device's local training also keeps those voices (the operator holds them; a device never has
    them). None when the bundle carries none. A set that does not fit ``head`` (its input size, its
    labels) is one EdgelearnError; ``FLClient``'s smoke check runs this before a version installs."""
    spec = (bundle.manifest.get("extra", {}) or {}).get("rehearsal")
    if not spec:
        return None
    name = spec.get("file", REHEARSAL_FILE)
    try:
        with np.load(bundle.path(name)) as z:
            X, y = z["X"], z["y"]
    except (OSError, ValueError, KeyError) as e:
        raise EdgelearnError(f"bundle v{bundle.version}'s rehearsal set {name} is unreadable ({e})",
                             fix="publish the version again from an aggregator whose --rehearsal file has X and y") from None
    why = rehearsal_misfit(X, y, head)
    if why:
        raise EdgelearnError(f"bundle v{bundle.version}'s rehearsal set {name} does not fit its head: {why}",
                             fix="publish the version again from an aggregator whose --rehearsal file fits the model")
    return X.astype(np.float32), y.astype(np.int64)


def rehearsal_misfit(X, y, head: dict) -> str | None:
    """Why a rehearsal set cannot train ``head`` (None when it can): finite (N, D) numbers for the head's
    input, one integer label per row that the head can name. The aggregator checks a set with this
    before it writes anything, and a device before it installs a version that carries one."""
    X, y = np.asarray(X), np.asarray(y)
    dim = np.asarray(head["proj.w"] if "proj.w" in head else head["classifier.w"]).shape[0]
    n = np.asarray(head["classifier.b"]).shape[0] if "classifier.b" in head else 0
    ok = (X.ndim == 2 and X.shape[1] == dim and len(X) > 0 and np.issubdtype(X.dtype, np.number)
          and bool(np.all(np.isfinite(X))) and y.shape == (len(X),) and np.issubdtype(y.dtype, np.integer)
          and y.min() >= 0 and y.max() < n)
    return None if ok else (f"X {X.shape} {X.dtype} and y {y.shape} {y.dtype}; it needs finite (N, {dim}) "
                            f"embeddings and N integer labels from 0 to {n - 1}")


# the whole head (projection and classifier): with a rehearsal set it kept the training voices and
# gained as much on new ones as the classifier alone, and met all three goals in 10 of 12 development
# schedules against 7 (scripts/fl_sweep.py, 2026-12-03); the classifier alone until then
SHIPPED_HEAD_TENSORS = ()


def shipped_head_trainer(labels, negative_share: float = 0.5, tensors=SHIPPED_HEAD_TENSORS,
                         keep_absent: bool = True) -> FederatedHeadTrainer:
    """The local trainer of the task that improves the shipped head (issue 18; bench/fl_voices.py):
    the whole head (``tensors``: only these, e.g. the classifier), outputs of labels the device never
    hears kept, ``negative_share`` of every batch ``_unknown_`` / ``_silence_``, the rest
    class-balanced. Pass it as ``FLClient(..., trainer=...)``, as the fleet simulator does (the agent keeps
    FLClient's default whole-head trainer; edge/agent.py says why)."""
    from edge.adapt.recipe import negative_ids

    tensors = list(tensors or ())
    return FederatedHeadTrainer("sparse" if tensors else "full", negatives=negative_ids(labels),
                                negative_share=negative_share, balance=True, tensors=tensors or None,
                                keep_absent=keep_absent)
