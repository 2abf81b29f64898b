"""The program layer: what `python -m aetv2_tf.train` adds on top of the library (BUILD.md,
"Architecture").

* `flags` (one module per purpose), `flag_support`: the absl flags and which backend runs which
  value;
* `config`: the flags read ONCE into a frozen `RunConfig` (the recipe, model, data, training,
  machine, outputs and probe), every combination checked; nothing reads the flags after it;
* `stages`: THE run sequence of every backend (machine, precision, data, model_dir, start line,
  then the stage);
* `backend`: what a Keras backend supplies, side by side `tensorflow_backend` (tf.distribute,
  tf.data, TensorBoard, SavedModel) and `keras_native_backend` (Keras on JAX and other
  backends);
* `pretext_stage` (with `pretext_data`): THE pretext training loop and THE build of its model
  (through the recipe); `probe_stage`: THE probe and supervised stage (built on
  `aetv2_tf.probes`);
* `run_control`: THE callback of the loop's ``fit`` that counts, stops and saves, and the typed
  `Outcome` of a run, with its parts `checkpoint_saver`, `divergence` (non-finite steps, the
  loss growth), `signal_stop`; `run_length`: the run's steps (``--epochs``, ``--train_steps``,
  ``--train_seconds``) and where an invocation stops;
* `monitoring` (progress bar, TensorBoard and CSV logs), `keras_checkpoints`, `rundir`,
  `precision`, `distribute`, `step_memory`, `console`: the run's machinery.

`aetv2_tf.train` is only the entry point: it parses the flags, picks the backend by Keras
backend, runs `stages.run` and turns the outcome into an exit code; `aetv2_tf.export` and
`aetv2_tf.report` are the other command lines. Nothing here (nor an entry point) is imported by
the library (`tests/test_program_structure.py`).
"""

import time as _time

#: When the program layer was first imported (`time.monotonic()`): the start of the program
#: that `--stop_after_seconds` counts from.
STARTED = _time.monotonic()
