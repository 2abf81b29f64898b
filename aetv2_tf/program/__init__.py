"""The program layer: what `python -m aetv2_tf.train` adds on top of the library (BUILD.md,
"Architecture").

* `flags`, `flag_support`: the absl flags and which backend runs which value;
* `common`: the backend-neutral parts of the program (flag checks, the flags' `Recipe`, the
  training images, step arithmetic, the fit and its summary, the start line, the quick KNN);
* `pretext`: THE pretext training loop (budget, steps, resume, callbacks, what a run writes);
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
