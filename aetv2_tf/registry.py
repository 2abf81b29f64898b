"""Every Keras object the package registers, known to Keras as soon as Keras is imported.

`keras.saving.load_model` finds a custom class only in Keras's registry (it imports the module a
config names only for Keras's own packages), so a `.keras` file the package or its CLI wrote
reloads in a fresh process only once the modules that define its classes ran. ``import
aetv2_tf`` does not import Keras (the program sets up the backend, logging and signals before
TensorFlow loads), so `register_when_keras_loads` arranges for `SERIALIZABLE` to be imported right
after Keras is: at once if Keras is already imported, else by a one-shot import hook on the
module ``keras``. Then

    import aetv2_tf, keras
    model = keras.saving.load_model("runs/<run>/aet_model.keras")

works on any backend, in either order of the two imports.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

#: The modules that define the package's registered (``register_keras_serializable``) objects;
#: each imports only Keras and NumPy at its top (no TensorFlow), so this is safe on any backend.
SERIALIZABLE = ("aetv2_tf.data.device", "aetv2_tf.losses", "aetv2_tf.metrics",
                "aetv2_tf.models.layers", "aetv2_tf.models.aet", "aetv2_tf.models.pairs",
                "aetv2_tf.models.heads", "aetv2_tf.models.encoders", "aetv2_tf.optim",
                "aetv2_tf.probes.classifier")


def register_all() -> None:
    """Imports `SERIALIZABLE` (which registers their classes with Keras)."""
    for name in SERIALIZABLE:
        importlib.import_module(name)


class _ThenRegister(importlib.abc.Loader):
    """Keras's own loader, then `register_all` once Keras's module has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):  # noqa: ANN001 (importlib's protocol)
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if not _package_module_initialising():
            register_all()
        # else a module of the package imported Keras: importing the others now would read
        # names that module has not defined yet; `aetv2_tf.__getattr__` registers once it is done.


class _KerasHook(importlib.abc.MetaPathFinder):
    """Finds ``keras`` through the other finders and wraps its loader; removes itself."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's protocol)
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


def _package_module_initialising(finishing: str = "") -> bool:
    """Whether a module of the package (other than its top, this one and ``finishing``, a module
    at its last line) is mid-import."""
    return any(name.startswith("aetv2_tf.") and name not in (__name__, finishing)
               and getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()))


def register_when_keras_loads(finishing: str = "") -> None:
    """`register_all` now if Keras is imported, else right after it is (module docstring).
    ``finishing``: the name of the module that calls this at its end (not mid-import then)."""
    if "keras" in sys.modules:
        if not _package_module_initialising(finishing):
            register_all()
    elif not any(isinstance(f, _KerasHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasHook())
