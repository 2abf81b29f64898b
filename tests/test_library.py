"""The library under the command line: the README's Python block on both backends, the recipes
equal to the configs, the program building through the same public constructors, an encoder
trained in Python probed by the CLI, models reloaded with `keras.saving.load_model`."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import aetv2_tf
from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.method import optimizers, recipes
from aetv2_tf.probes.results import RESULTS_FILENAME, read_results
from aetv2_tf.program.config import recipe_of
from aetv2_tf.program.flags import FLAGS, program_flags
from tests.cli import REPO, run_module


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_readme_python_block_runs(backend, tmp_path, cifar10_dir):
    """The README's block, its own code in a fresh directory on each backend, through
    `benchmarks.readme_block --tiny` (4 steps of 32 pairs, KNN and fine-tuning on 640 vs 192
    images; only the data path and the sizes changed): it pretrains, saves, reloads, prints its
    KNN beside a random init's and fine-tunes a classifier. The KNN margin the README states
    needs the block's 150 steps (4 CPU-minutes): `python -m benchmarks.readme_block` checks it,
    BENCHMARKS.md has its runs."""
    proc = run_module("benchmarks.readme_block", "--tiny", f"--backend={backend}",
                      f"--data_dir={cifar10_dir}", f"--work_dir={tmp_path}", "--no_record",
                      timeout=900)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(backend, r)
    assert r["backend"] == backend and "(not checked)" in proc.stdout
    assert 10.0 < r["random_init"] <= 100.0 and 10.0 < r["trained"] <= 100.0
    assert 15.0 < r["fine_tuned"] <= 100.0
    saved = json.loads((tmp_path / "runs/python/encoder/flags.json").read_text())
    assert (saved["backbone"], saved["loss"], saved["backend"]) == ("nin", "geodesic", backend)
    assert (tmp_path / "runs/python/encoder/encoder.weights.h5.sha256").is_file()
    assert (tmp_path / "runs/python/aet.keras").is_file()


def test_readme_block_is_the_one_the_benchmark_runs(tmp_path):
    """`benchmarks.readme_block` finds the README's one block, shrinks it only where it says,
    refuses a README whose block it no longer understands, and holds the README's margin."""
    from benchmarks import readme_block

    code = readme_block.readme_python_block()
    assert "recipe.build_model(encoder" in code and "knn_accuracy" in code
    assert readme_block.prepare(code, "/data", tiny=False) == code.replace(
        readme_block.README_DATA, "/data")
    tiny = readme_block.prepare(code, "/data", tiny=True)
    assert "STEPS, BATCH = 4, 32" in tiny and "images[:5000]" not in tiny
    with pytest.raises(ValueError, match="STEPS, BATCH = 150, 64"):
        readme_block.prepare(code.replace("150, 64", "200, 64"), "/data", tiny=False)
    readme = tmp_path / "README.md"
    readme.write_text("## Use it from Python\n```python\na\n```\n```python\nb\n```\n## Next\n")
    with pytest.raises(ValueError, match="has 2 Python blocks"):
        readme_block.readme_python_block(readme)
    text = (REPO / "README.md").read_text()
    assert f"at least +{readme_block.MIN_MARGIN:g}" in text and "benchmarks.readme_block" in text


def recipe_of_flagfile(name: str) -> recipes.Recipe:
    """The recipe the program reads from a config (`program.config.recipe_of`), parsed without
    touching the process's FLAGS: every flag at its default, then the flagfile's lines."""
    values = {flag.name: flag.default for flag in program_flags()}

    def lines(path):  # nested --flagfile= lines expanded in place (paths from REPO)
        for line in path.read_text().splitlines():
            if line.startswith("--flagfile="):
                yield from lines(REPO / line.split("=", 1)[1])
            else:
                yield line

    for line in lines(REPO / "configs" / f"{name}.cfg"):
        if line.startswith("--"):
            key, _, value = line[2:].partition("=")
            if key.startswith("no") and not value and key[2:] in values:
                key, value = key[2:], "false"
            values[key] = FLAGS[key].parser.parse(value or "true")
    return recipe_of(values)


def test_the_recipes_are_the_configs():
    assert recipe_of_flagfile("cifar10_aetv2") == recipes.AETV2
    assert recipe_of_flagfile("cifar10_aetv2_zoom16") == recipes.AETV2_ZOOM16
    assert recipe_of_flagfile("cifar10_aetv2_paper") == recipes.AETV2_PAPER
    assert recipe_of_flagfile("cifar10_aetv1") == recipes.AETV1
    assert recipe_of_flagfile("cifar10_aetv1_official") == recipes.AETV1_OFFICIAL
    assert recipe_of_flagfile("cifar10_aetv2_sq4") == recipes.AETV2_SQ4
    assert recipe_of_flagfile("cifar10_aetv2_sq4_unitres") == recipes.AETV2_SQ4_UNITRES
    assert recipe_of_flagfile("cifar10_aetv2_hybrid") == recipes.AETV2_HYBRID
    assert recipes.AETV2_ZOOM16.loss.residual_frame == "loss"
    assert recipes.AETV2_SQ4_UNITRES is recipes.AETV2 and recipes.as_recipe(
        "aetv2_sq4_unitres") is recipes.AETV2  # the name of its config
    with pytest.raises(ValueError, match="residual_frame"):
        recipes.Recipe(residual_frame="pixel")
    with pytest.raises(ValueError, match="mse_target"):
        recipes.Recipe(loss="geodesic", mse_target="official")
    with pytest.raises(ValueError, match="kind='l1'"):
        recipes.Recipe(loss="l1")
    with pytest.raises(TypeError, match="no field 'learning_rat'"):
        recipes.AETV2.replace(learning_rat=3e-4)
    changed = dataclasses.replace(recipes.AETV2, learning_rate=3e-4)  # by the parts' names
    assert changed == recipes.AETV2.replace(learning_rate=3e-4)
    assert changed.optimizer.learning_rate == 3e-4 and changed.loss == recipes.AETV2.loss


def test_recipe_builds_the_loss_the_paper_describes():
    geodesic = recipes.AETV2.build_loss(image_size=32)
    assert type(geodesic).__name__ == "GeodesicLoss"
    assert geodesic.get_config()["frame"] == [[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 1.0]]
    assert geodesic.get_config()["projection_weight"] == 10.0
    assert geodesic.get_config()["residual_frame"] == "unit"
    assert geodesic.get_config()["angle_power"] == 2
    mse = recipes.AETV1.build_loss(image_size=32)
    np.testing.assert_allclose(mse.get_config()["std"], parameter_std(32), rtol=1e-6)


def hooked_cli(tmp_path, name: str, *args: str, backend: str = "tensorflow") -> dict:
    """The program run with its public constructors watched (`tests/library_hooks.py`)."""
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend)
    proc = subprocess.run([sys.executable, "tests/library_hooks.py", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_both_programs_build_through_the_recipe(tmp_path, cifar10_dir, backend):
    """Both adapters build their pretext model with `Recipe.build_model` (which decides the
    decoder, `Recipe.decoder_options`) and compile it from the recipe (`Recipe.build_loss`,
    `build_optimizer`): the config's recipe with the command line's override; under
    TensorFlow `--stage=probe --probe=knn` then scores with the public `pooled_features` and
    `knn_accuracy`."""
    pretext = tmp_path / "pretext"
    seen = hooked_cli(tmp_path, "pretext", "--flagfile=configs/cifar10_aetv2.cfg",
                      f"--data_dir={cifar10_dir}", f"--model_dir={pretext}",
                      "--train_steps=1", "--batch_size=8", "--train_examples=64",
                      "--learning_rate=3e-4", "--export=false", "--verbose=0", backend=backend)
    for name in ("build_model", "decoder_options", "build_loss", "build_optimizer",
                 "build_pairs_model", "build_aet_model"):
        assert seen["calls"].get(name, 0) >= 1, (name, seen["calls"])
    want = json.loads(json.dumps(dataclasses.asdict(  # as the JSON file has it
        recipes.AETV2.replace(learning_rate=3e-4))))
    assert all(r == want for r in seen["recipes"]), seen["recipes"]
    if backend != "tensorflow":
        return
    seen = hooked_cli(tmp_path, "knn", "--flagfile=configs/cifar10_probe_knn.cfg",
                      f"--data_dir={cifar10_dir}", f"--model_dir={tmp_path / 'knn'}",
                      f"--pretrained={pretext}", "--train_examples=300", "--test_examples=100",
                      "--verbose=0")
    assert seen["calls"]["knn_accuracy"] == 1 and seen["calls"]["pooled_features"] >= 2


@pytest.mark.slow
def test_an_encoder_trained_in_python_is_probed_by_the_cli(tmp_path, cifar10_dir):
    images, _ = aetv2_tf.load_cifar10(str(cifar10_dir), "train")
    encoder = aetv2_tf.build_backbone("nin")
    model = aetv2_tf.build_pairs_model(encoder, seed=0)
    recipe = recipes.AETV1
    _, optimizer = recipe.build_optimizer(steps=2)
    model.compile(optimizer=optimizer, loss=recipe.build_loss(32), metrics=recipe.metrics())
    model.fit(images[:64], batch_size=32, epochs=1, verbose=0)
    directory = aetv2_tf.save_encoder(encoder, str(tmp_path / "encoder"), recipe=recipe)
    again = aetv2_tf.load_encoder(directory, batch_norm="fused")
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(again(x, training=False)["block2"],
                               encoder(x, training=False)["block2"], atol=1e-5)
    model.save(tmp_path / "aet.keras")  # the compiled metrics and loss reload
    reloaded = keras.saving.load_model(tmp_path / "aet.keras")
    # the L2 decay too: it is the optimizer's, saved with it, and shown apart again
    compiled = [m.name for m in model.metrics]
    assert [m.name for m in reloaded.metrics] == compiled == [
        "loss", "compile_metrics", "l2_penalty"]
    assert optimizers.coupled_l2_decay(reloaded.optimizer) == recipe.optimizer.weight_decay > 0
    run_module("aetv2_tf.train", "--flagfile=configs/cifar10_probe_knn.cfg",
               f"--pretrained={directory}", f"--model_dir={tmp_path / 'knn'}",
               f"--data_dir={cifar10_dir}", "--train_examples=300", "--test_examples=100",
               "--verbose=0")
    r = read_results(tmp_path / "knn" / RESULTS_FILENAME)
    assert (r["method"], r["pretrained_kind"], r["probe"]) == ("AETv1", "model_dir", "knn")


def test_public_names_are_visible():
    for name in ("AETV2", "build_pairs_model", "save_encoder", "load_encoder", "knn_accuracy",
                 "pooled_features", "GeodesicLoss", "pretext_dataset", "AETV2_SQ4",
                 "AETV2_SQ4_UNITRES", "AETV2_HYBRID"):
        assert name in dir(aetv2_tf) and getattr(aetv2_tf, name) is not None
    probes, models = (importlib.import_module(f"aetv2_tf.{m}") for m in ("probes", "models"))
    assert {"quick_knn", "pooled_features", "knn_accuracy"} <= set(dir(probes))
    assert {"build_pairs_model", "WarpPairs", "PairsModel"} <= set(models.__all__)
    # dir() is the API: not the module's imports (os, importlib, Any) nor loaded submodules
    assert dir(aetv2_tf) == sorted([*aetv2_tf.__all__, "__version__"])


def test_a_mistyped_preset_is_refused_with_the_list_of_presets(configured, tmp_path,
                                                               monkeypatch):
    """`load_encoder("aetv3")` and ``--pretrained=aetv3``: a name that is no preset and no
    path is refused naming the presets (and the closest), not read as a missing directory;
    a path, an existing name and --pretrained=none are read as given."""
    with pytest.raises(ValueError, match=r"'aetv3' is neither a preset nor an existing path: "
                                         r"did you mean 'aetv2_cifar10'\? the presets are "
                                         r"aetv1_cifar10, .*aetv2_paper_cifar10"):
        aetv2_tf.load_encoder("aetv3")
    from aetv2_tf.errors import UsageError
    from aetv2_tf.program.probe_stage import check_probe

    config = configured("--stage=probe", "--pretrained=aetv3", f"--model_dir={tmp_path / 'p'}")
    with pytest.raises(UsageError, match=r"--pretrained=aetv3: 'aetv3' is neither a preset nor"):
        check_probe(config)  # the probe's first check, before anything is written
    with pytest.raises(FileNotFoundError, match="has no flags.json"):  # a path: a directory
        aetv2_tf.load_encoder(str(tmp_path / "aetv3"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "aetv3").mkdir()  # an existing folder of that name: a path
    with pytest.raises(FileNotFoundError, match="has no flags.json"):
        aetv2_tf.load_encoder("aetv3")
    config = configured("--stage=probe", "--pretrained=none", f"--model_dir={tmp_path / 'q'}")
    assert config.probe.pretrained == "none"


def test_saved_encoders_keep_their_image_size_and_warp_pairs_their_compiler(tmp_path):
    """An encoder of another input size reloads at that size; a model with the fused warp (no
    XLA kernel) tells Keras's jit_compile="auto" not to compile it with XLA; a recipe with an
    MSE warm-up asks for its step."""
    from aetv2_tf.models.pretext import WarpPairs

    encoder = aetv2_tf.build_backbone("nin", (48, 48, 3))
    again = aetv2_tf.load_encoder(aetv2_tf.save_encoder(encoder, str(tmp_path / "nin48")))
    assert again.input_shape == (None, 48, 48, 3)
    np.testing.assert_allclose(again.get_weights()[0], encoder.get_weights()[0])
    assert WarpPairs().supports_jit is False and WarpPairs(fused=False).supports_jit is True
    warm_up = dataclasses.replace(recipes.AETV2, mse_weight=1.0, mse_decay_steps=10)
    with pytest.raises(ValueError, match="step=model.loss_step"):
        warm_up.build_loss(32)
    assert warm_up.build_loss(32, step=keras.Variable(0, dtype="int64")).step is not None
