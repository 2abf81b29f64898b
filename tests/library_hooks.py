"""The command line with the library's public constructors watched: which of them the program
called, and with what recipe (`tests/test_library.py`).

    python tests/library_hooks.py OUTPUT.json --flagfile=... --model_dir=...

Wraps `Recipe.build_model`, `Recipe.build_loss`, `Recipe.build_optimizer`,
`Recipe.decoder_options`, `aetv2_tf.models.build_aet_model`, `build_pairs_model` and the KNN
probe's `knn_accuracy` with counters, runs `aetv2_tf.train`'s main as `python -m
aetv2_tf.train` would, and writes the counts and the recipes to OUTPUT.json.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402

import aetv2_tf.models  # noqa: E402
from aetv2_tf.method import recipes  # noqa: E402
from aetv2_tf.models import aet, pretext  # noqa: E402
from aetv2_tf.probes import knn  # noqa: E402
from aetv2_tf.program import probe_stage  # noqa: E402

CALLS: dict[str, int] = {}
RECIPES: list[dict] = []


def watch(owners, name: str, record_recipe: bool = False) -> None:
    """Counts the calls of ``name`` wherever the program looks it up (each of ``owners``)."""
    original = getattr(owners[0], name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        CALLS[name] = CALLS.get(name, 0) + 1
        if record_recipe:
            RECIPES.append(dataclasses.asdict(args[0]))
        return original(*args, **kwargs)

    for owner in owners:
        setattr(owner, name, wrapper)


watch([recipes.Recipe], "build_model", record_recipe=True)
watch([recipes.Recipe], "build_loss", record_recipe=True)
watch([recipes.Recipe], "build_optimizer", record_recipe=True)
watch([recipes.Recipe], "decoder_options", record_recipe=True)
watch([aet, pretext, aetv2_tf.models], "build_aet_model")
watch([pretext, aetv2_tf.models], "build_pairs_model")
watch([knn, probe_stage], "knn_accuracy")
watch([knn, probe_stage], "pooled_features")


@atexit.register
def write() -> None:
    with open(OUTPUT, "w") as f:
        json.dump({"calls": CALLS, "recipes": RECIPES}, f)


if __name__ == "__main__":
    OUTPUT = sys.argv.pop(1)
    from aetv2_tf import train

    app.run(train.main)
