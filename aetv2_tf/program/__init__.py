"""The program layer: what `python -m aetv2_tf.train` adds on top of the library (BUILD.md,
"Architecture").

* `flags` (one module per purpose), `flag_support`: the absl flags and which backend runs which
  value;
* `config`: the flags read ONCE into a frozen `RunConfig` (the recipe, model, data, training,
  machine, outputs and probe), every combination checked; nothing reads the flags after it;
* `run_length`: the run's steps (``--epochs``, ``--train_steps``, ``--train_seconds``) and where
  an invocation stops;
* `common`: what both adapters share besides: the training images, the fit and its summary,
  the start line, the quick KNN;
* `pretext`: THE pretext training loop and THE build of its model (through the recipe);
* `probe_stage`: THE probe and supervised stage (built on `aetv2_tf.probes`);
* `callbacks`, `keras_checkpoints`, `rundir`, `precision`, `distribute`, `console`: the run's
  machinery;
* the backend adapters, side by side: `adapter_tensorflow` (tf.distribute, tf.data,
  TensorBoard, SavedModel) and `adapter_portable` (Keras on JAX and other backends).

`aetv2_tf.train` is only the entry point: it parses the flags, picks the adapter by Keras
backend and turns the outcome into an exit code; `aetv2_tf.export` and `aetv2_tf.report` are the
other command lines. Nothing here (nor an entry point) is imported by the library
(`tests/test_program_structure.py`).
"""

import time as _time

#: When the program layer was first imported (`time.monotonic()`): the start of the program
#: that `--stop_after_seconds` counts from.
STARTED = _time.monotonic()
