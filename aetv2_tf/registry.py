"""Every Keras object the package registers, known to Keras as soon as Keras is imported.

`keras.saving.load_model` finds a custom class only in Keras's registry, so a `.keras` file the
package wrote reloads in a fresh process only once the modules defining its classes ran.
``import aetv2_tf`` does not import Keras, so `install` arranges for `SERIALIZABLE` to be
imported as soon as Keras is there and no module of the package is mid-import (such a module's
names may not be defined yet): a one-shot import hook wraps the loaders of ``keras`` and of the
package's modules, and the first of them to finish with Keras imported and nothing of the
package half-done runs `register_all`, then removes the hook. So, in any import order and on
any backend, ``import aetv2_tf, keras; keras.saving.load_model("runs/<run>/aet_model.keras")``
works. Keras does not check what it loads: ``aetv2_tf.load_model`` first checks the file's
SHA-256.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from types import ModuleType
from typing import Any

#: The modules that define the package's ``register_keras_serializable`` objects; each imports
#: only Keras and NumPy at its top, so this is safe on any backend.
SERIALIZABLE = ("aetv2_tf.data.preprocessing_layers", "aetv2_tf.method.losses",
                "aetv2_tf.method.metrics", "aetv2_tf.method.optimizers", "aetv2_tf.method.recipes",
                "aetv2_tf.models.batch_groups", "aetv2_tf.models.blocks", "aetv2_tf.models.aet",
                "aetv2_tf.models.pretext", "aetv2_tf.models.heads", "aetv2_tf.models.image_models",
                "aetv2_tf.models.displayed_loss", "aetv2_tf.probes.classifier")

_state = {"registered": False}


def register_all() -> None:
    """Imports `SERIALIZABLE` (which registers their classes with Keras); once."""
    if _state["registered"]:
        return
    _state["registered"] = True
    _uninstall()
    for name in SERIALIZABLE:
        importlib.import_module(name)


def _initialising(name: str) -> bool:
    module = sys.modules.get(name)
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _ready(finishing: str = "") -> bool:
    """Keras imported, and no module of the package but ``finishing`` (at its end) mid-import."""
    if "keras" not in sys.modules or (finishing != "keras" and _initialising("keras")):
        return False
    return not any(name.startswith("aetv2_tf.") and name not in (__name__, finishing)
                   and _initialising(name) for name in list(sys.modules))


# Hooks and loaders are recognised by markers, not by class: a second copy of this module (the
# package imported afresh in one process) must not take the first one's hook for a finder.
_HOOK, _LOADER = "_aetv2_tf_registry_hook", "_aetv2_tf_registry_loader"


class _ThenRegister(importlib.abc.Loader):
    """A module's own loader, then `register_all` if the package is ready (module docstring)."""

    _aetv2_tf_registry_loader = True

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... (runpy, inspect)
        return getattr(self.loader, name)

    def create_module(self, spec):  # noqa: ANN001 (importlib's protocol)
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if not _state["registered"] and _ready(finishing=module.__name__):
            register_all()


class _Hook(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``keras`` and of ``aetv2_tf.*`` found by the other finders."""

    _aetv2_tf_registry_hook = True

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's protocol)
        if fullname != "keras" and not fullname.startswith("aetv2_tf."):
            return None
        for finder in list(sys.meta_path):
            if getattr(finder, _HOOK, False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not getattr(spec.loader, _LOADER, False):
                    spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


def _uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _HOOK, False)]


def install() -> None:
    """`register_all` now if the package is ready, else when it is (module docstring)."""
    if _state["registered"]:
        return
    if _ready():
        register_all()
    elif not any(getattr(f, _HOOK, False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
