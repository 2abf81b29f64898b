"""How much of the transformation a frozen encoder's block-4 features hold (the loss screen): a
linear read-out of the quarter turn, the scale, the translation and the keystone. CPU, no training.

    python -m experiments.loss_screen.readout results/scale/aetv1_lr1e-4 \
        results/scale/aetv2_recipe none

Each argument is a directory that ``--pretrained`` takes (a pretraining ``--model_dir`` or a
`save_encoder` directory, read by `aetv2_tf.files.saving.load_encoder`), or ``none`` (a random-init
NIN, seeded by ``--seed``). Protocol:

* pairs ``(x, t(x))`` from the first ``--pairs`` CIFAR-10 TEST images, made by the project's
  sampler and warp (`pretext_dataset`, no pre-augmentation, seed ``--pair_seed``: the same
  pairs for every encoder); ``T`` maps x to t(x) in the model frame (conventions.md);
* features: ``[E(x), E(t(x))]``, block 4 of the NIN (inference mode) averaged over space,
  192 + 192 = 384 values, standardised with the train part's mean and std;
* a ridge regression (``--alpha``, closed form, an intercept) fitted on the first
  ``--train_fraction`` of the pairs, scored on the rest:
  quarter turn: ridge on the one-hot ``k`` (the sampler's), accuracy of the arg-max;
  scale: ``sqrt(|det A|)``, ``A`` the 2x2 linear block of ``T / T[2, 2]``, R^2;
  translation: ``(T[0, 2], T[1, 2])`` (where the centre goes), R^2 averaged over the two;
  keystone: ``(T[2, 0], T[2, 1])`` (the perspective entries), R^2 averaged over the two.

Prints one markdown row per encoder (and a JSON line of the numbers with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import aetv2_tf  # noqa: F401  (before TensorFlow: the package asks for oneDNN)

TARGETS = ("quarter turn accuracy", "scale R^2", "translation R^2", "keystone R^2")


def make_pairs(data_dir: str, pairs: int, seed: int) -> dict[str, np.ndarray]:
    """``{x, tx}`` (N, 32, 32, 3) normalised float32, ``params`` (N, 8) and ``k`` (N,) int."""
    from aetv2_tf.data.pipelines import pretext_dataset
    from aetv2_tf.data.sources import load_cifar10

    images, _ = load_cifar10(data_dir, "test")
    ds = pretext_dataset(images[:pairs], 256, seed=seed, training=False, augment=False,
                         repeat=False, drop_remainder=False, with_rotation=True)
    parts: dict[str, list] = {"x": [], "tx": [], "params": [], "k": []}
    for (x, tx), (params, k) in ds:
        for name, value in zip(parts, (x, tx, params, k), strict=True):
            parts[name].append(np.asarray(value))
    return {name: np.concatenate(value) for name, value in parts.items()}


def targets(params: np.ndarray) -> dict[str, np.ndarray]:
    """The regression targets of ``params`` (N, 8) model-frame parameters: ``scale`` (N, 1),
    ``translation`` (N, 2), ``keystone`` (N, 2) (module docstring)."""
    p = np.asarray(params, np.float64)
    det = p[:, 0] * p[:, 4] - p[:, 1] * p[:, 3]
    return {"scale": np.sqrt(np.abs(det))[:, None], "translation": p[:, [2, 5]],
            "keystone": p[:, [6, 7]]}


def load(name: str, seed: int):
    """The NIN encoder of ``name`` (a directory or ``none``), cut to block 4 + global pooling."""
    import keras

    from aetv2_tf.files.saving import load_encoder
    from aetv2_tf.models import build_backbone

    if name.lower() == "none":
        keras.utils.set_random_seed(seed)
        encoder = build_backbone("nin", (32, 32, 3), batch_norm="keras")
    else:
        encoder = load_encoder(name)
    maps = encoder.output["block4"]
    return keras.Model(encoder.input, keras.ops.mean(maps, axis=(1, 2)))


def features(model, pairs: dict[str, np.ndarray], batch_size: int = 256) -> np.ndarray:
    """(N, 384) float64: ``[E(x), E(t(x))]`` of the pairs (inference mode)."""
    return np.concatenate([model.predict(pairs[k], batch_size=batch_size, verbose=0)
                           for k in ("x", "tx")], axis=1).astype(np.float64)


def ridge(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
          alpha: float) -> np.ndarray:
    """Ridge regression with an intercept on features standardised by the train part:
    (n, d), (n, m), (n', d) -> (n', m) predictions."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-8
    a, b = (x_train - mean) / std, (x_test - mean) / std
    y_mean = y_train.mean(0)
    w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ (y_train - y_mean))
    return b @ w + y_mean


def r2(y: np.ndarray, prediction: np.ndarray) -> float:
    """R^2 averaged over the columns of ``y`` (n, m)."""
    residual = ((y - prediction) ** 2).sum(0)
    total = ((y - y.mean(0)) ** 2).sum(0)
    return float(np.mean(1.0 - residual / total))


def read_out(feats: np.ndarray, params: np.ndarray, k: np.ndarray, train_fraction: float,
             alpha: float) -> dict[str, float]:
    """The four numbers of `TARGETS` for features (N, D) of pairs with ``params``, ``k``."""
    n = int(round(train_fraction * len(feats)))
    tr, te = slice(0, n), slice(n, None)
    onehot = np.eye(4)[np.asarray(k, int)]
    turn = ridge(feats[tr], onehot[tr], feats[te], alpha).argmax(1)
    out = {TARGETS[0]: float(np.mean(turn == np.asarray(k)[te]))}
    for name, y in targets(params).items():
        out[f"{name} R^2"] = r2(y[te], ridge(feats[tr], y[tr], feats[te], alpha))
    return out


def main() -> None:
    from benchmarks import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("encoders", nargs="+", help="Encoder directories, or none (random init).")
    p.add_argument("--pairs", type=int, default=4000, help="Pairs from the first test images.")
    p.add_argument("--train_fraction", type=float, default=0.75)
    p.add_argument("--alpha", type=float, default=10.0, help="Ridge penalty (standardised).")
    p.add_argument("--pair_seed", type=int, default=12345)
    p.add_argument("--seed", type=int, default=0, help="Seed of a random-init encoder.")
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10))
    p.add_argument("--json", action="store_true", help="Also print a JSON line per encoder.")
    args = p.parse_args()
    common.keras_quiet()
    pairs = make_pairs(args.data_dir, args.pairs, args.pair_seed)
    n = len(pairs["k"])
    n_train = int(round(args.train_fraction * n))
    print(f"| encoder | {' | '.join(TARGETS)} | pairs (train / held out) | wall |")
    print("|---" * (len(TARGETS) + 3) + "|")
    for name in args.encoders:
        start = time.perf_counter()
        result = read_out(features(load(name, args.seed), pairs), pairs["params"], pairs["k"],
                          args.train_fraction, args.alpha)
        wall = time.perf_counter() - start
        print(f"| {name} | " + " | ".join(f"{result[t]:.3f}" for t in TARGETS)
              + f" | {n_train} / {n - n_train} | {wall:.0f} s |", flush=True)
        if args.json:
            print(json.dumps({"encoder": name, **result, "pairs": n, "wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
