"""The committed encoders of `results/` (docs/reproduction.md, "At scale (GPU)") stay usable:
each restores through the same path as `--pretrained=results/scale/<name>`, and its training log
is the finished run the table reports."""

import csv
import json
import pathlib

import numpy as np
import pytest

from aetv2_tf.export import restore_encoder

SCALE = pathlib.Path(__file__).resolve().parents[1] / "results" / "scale"
RUNS = sorted(p.parent.name for p in SCALE.glob("*/encoder.weights.h5"))


def test_the_scale_table_has_its_encoders():
    assert {"aetv2_recipe", "aetv1_lr1e-4", "aetv2_paper"} <= set(RUNS)


@pytest.mark.parametrize("name", RUNS)
def test_a_scale_encoder_restores_and_its_run_finished(name):
    run = SCALE / name
    flags = json.loads((run / "flags.json").read_text())
    encoder, saved = restore_encoder(str(run))
    assert saved["backbone"] == "nin" and encoder.name == "nin"
    weights = encoder.get_weights()
    assert weights and all(np.isfinite(w).all() for w in weights)
    with open(run / "train" / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["step"]) == flags["train_steps"] == 8000
    assert np.isfinite(float(rows[-1]["loss"]))
