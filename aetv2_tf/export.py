"""SavedModel export of the encoder, for feature extraction without this package.

    python -m aetv2_tf.export --model_dir=runs/quickstart [--output=DIR]

Its `serving_default` signature takes uint8 images (B, H, W, 3) (32x32 for NIN, 224x224 for
AlexNet), normalises them inside and returns a dict of float32 feature maps (`block1`..`block4`;
`conv1`..`conv5`, `fc6`, `fc7`); another dtype or size, or one image, is refused
(`aetv2_tf.files.savedmodel`: convert [0, 1] floats first):

    encoder = tf.saved_model.load("runs/quickstart/export/encoder")
    features = encoder.signatures["serving_default"](images=uint8_batch)   # dict of tensors

Beside it `aetv2_export.json` holds the SHA-256 of each file (`aetv2_tf.files.provenance`): an
existing `--output` is replaced only when it is such an export (or empty); anything else, or an
`--output` inside the run (other than under its `export/`) or the data it read, or holding
either (`aetv2_tf.files.nesting`), is refused, exit 2, nothing touched. SIGTERM or SIGINT during
the export stops it keeping nothing (its scratch folder removed), exit 128 + N. This module is
the command line (the program layer); the library functions are `aetv2_tf.files.savedmodel`'s
`restore_encoder` and `export_encoder` (also importable from here). Its console is as quiet as
the training program's (`program.console`; `--verbosity=0` or ``AETV2_VERBOSE=1`` for more).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from absl import app, flags

from aetv2_tf.errors import UsageError
from aetv2_tf.files.nesting import refuse_nested
from aetv2_tf.files.provenance import ExportTargetError, check_export_target
from aetv2_tf.files.safe_paths import read_json, refuse_link
from aetv2_tf.program import console
from aetv2_tf.program.run_lock import refuse_training
from aetv2_tf.program.signal_stop import Interrupted, interrupting

FLAGS = flags.FLAGS


def __getattr__(name: str) -> Any:
    """`export_encoder` and `restore_encoder`, imported on first use (they import Keras, which
    the command line imports quietly)."""
    if name in ("export_encoder", "restore_encoder"):
        from aetv2_tf.files import savedmodel

        return getattr(savedmodel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_flags() -> None:
    # Defined only when run (`python -m aetv2_tf.export`): importing this module defines no flag.
    flags.DEFINE_string("model_dir", None, "A pretraining --model_dir (its newest checkpoint).")
    flags.DEFINE_string("output", None, "Where to write the SavedModel (default "
                        "MODEL_DIR/export/encoder).")


def _fail(message: str) -> None:
    """Bad input: the message on stderr and exit 2 (docs/reliability.md), never a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _data_dir(model_dir: str) -> str | None:
    """The ``data_dir`` the run's flags.json records (None when it has none or is unreadable:
    reading the encoder then says why)."""
    try:
        data_dir = read_json(os.path.join(model_dir, "flags.json")).get("data_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return data_dir if isinstance(data_dir, str) else None


def main(argv) -> None:
    del argv
    if not FLAGS.model_dir:
        _fail("--model_dir is required: the pretraining run to export.")
    model_dir = os.path.expanduser(FLAGS.model_dir)
    output = os.path.expanduser(FLAGS.output or os.path.join(model_dir, "export", "encoder"))
    try:
        refuse_training(model_dir, f"--model_dir={model_dir}")
        if not FLAGS.output:  # the run's export/ folder is written into: never through a link
            refuse_link(os.path.join(model_dir, "export"))
        check_export_target(output)  # before any work: a refused --output exits 2, untouched
        refuse_nested({"--output": output},
                      {"--model_dir": model_dir, "the run's --data_dir": _data_dir(model_dir)},
                      within={"--model_dir": os.path.join(model_dir, "export")})
    except (ExportTargetError, UsageError) as e:
        _fail(str(e))
    with console.quiet_native_stderr(not console.verbose_requested()):
        import tensorflow as tf

        from aetv2_tf.files.savedmodel import export_encoder, restore_encoder
    console.configure_logging(FLAGS["verbosity"].present)

    try:
        encoder, saved = restore_encoder(model_dir)
    except (OSError, ValueError, tf.errors.OpError) as e:
        _fail(f"the encoder of --model_dir={model_dir} could not be restored ({e}).")
    try:
        with interrupting(f"during the export to {output}: nothing of it was kept; rerun the "
                          "same command to export"):
            export_encoder(encoder, output, saved["dataset"])
    except (ExportTargetError, OSError) as e:
        _fail(f"--output={output}: {e}")
    except Interrupted as stop:
        print(stop, flush=True)
        sys.exit(stop.exit_code)
    print(f"Exported the encoder to {output}")


if __name__ == "__main__":
    from aetv2_tf.program.flagfiles import parse_command_line

    _define_flags()
    app.run(main, flags_parser=parse_command_line)  # flagfiles checked before absl reads them
