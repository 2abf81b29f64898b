"""The README's Python block with another recipe ("AETv1 by switching the recipe"):
pretrain a NIN for STEPS x 64 pairs with `as_recipe(NAME)` (warm-up STEPS // 10, optionally
another learning rate), then the authors' KNN of block 2 on 5,000 vs 1,000 images beside a
random init (unseeded: the random init differs per call).

    python -m experiments.loss_screen.recipe_switch aetv1 150 1e-3     # NAME STEPS [LEARNING_RATE]

Prints one line: the arguments, the training wall time, both KNN top-1 scores, the KNN time.
"""

import dataclasses
import sys
import time

import aetv2_tf
from benchmarks import common


def main() -> None:
    name, steps = sys.argv[1], int(sys.argv[2])
    batch = 64
    images, labels = aetv2_tf.load_cifar10(str(common.DEFAULT_CIFAR10), "train")
    test_images, test_labels = aetv2_tf.load_cifar10(str(common.DEFAULT_CIFAR10), "test")
    start = time.time()
    changes = {"learning_rate": float(sys.argv[3])} if len(sys.argv) > 3 else {}
    recipe = dataclasses.replace(aetv2_tf.as_recipe(name), warmup_steps=steps // 10, **changes)
    encoder = aetv2_tf.build_backbone("nin")
    model = recipe.build_model(encoder, seed=0)
    recipe.compile(model, steps=steps)
    model.fit(images[:steps * batch], batch_size=batch, epochs=1, verbose=0)
    trained = time.time()

    def knn(encoder) -> float:
        extract = aetv2_tf.feature_extractor(encoder, "block2")
        return aetv2_tf.knn_accuracy(extract.predict(images[:5000], verbose=0), labels[:5000],
                                     extract.predict(test_images[:1000], verbose=0),
                                     test_labels[:1000])

    print(sys.argv[1:], f"train {trained - start:.0f}s",
          f"KNN {knn(encoder):.1f} random {knn(aetv2_tf.build_backbone('nin')):.1f}",
          f"knn time {time.time() - trained:.0f}s")


if __name__ == "__main__":
    main()
