"""Keep a user model's host tensors in step with the device ("Weight sync").

A training wrapper leaves the host copies stale after every run. Rather than copying weights
back after each run (which would cost every step), the wrapper marks the host *dirty*, and the
first host access copies them back once:

- each module of the user model gets a per-class subclass (same name, swapped in through
  ``__class__`` and restored by ``destroy()``) whose ``__getattr__`` - the path of every
  ``model.fc.weight``, ``model.bn.running_mean`` and submodule lookup, since ``nn.Module``
  keeps them in dicts - and ``named_parameters`` / ``named_buffers`` / ``state_dict`` (hence
  ``parameters()``, ``buffers()``) pull first; so does ``_load_from_state_dict``, which
  ``load_state_dict`` calls on each module (of the hooked model, or of a model containing
  it) before writing its tensors: the loaded values replace the device's, and no later pull
  writes the device's back over them;
- an inference wrapper of the same user model remembers the training wrapper's device
  *version* (bumped by each training run); when it moved, it pulls the training weights to the
  host and pushes them to its own device before running. The same holds when one wrapper's
  model is a submodule of the other's (a training wrapper of ``ModelWithLoss(net)`` and an
  inference wrapper of ``net``, or the other way round): ``links_over`` finds every training
  link whose hooked modules the inference model shares.

``ModelLink`` is the per-model record: the live training wrapper, its version, the dirty flag.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["ModelLink", "link_of", "links_over", "install_hooks", "remove_hooks"]

_LINKS: "weakref.WeakKeyDictionary[torch.nn.Module, ModelLink]" = weakref.WeakKeyDictionary()
# module -> link, for every module of a hooked model (looked up by the hooked methods).
_MODULE_LINKS: "weakref.WeakKeyDictionary[torch.nn.Module, ModelLink]" = (
    weakref.WeakKeyDictionary())
_HOOKED_CLASSES: dict[type, type] = {}
# Bumped whenever hooks are installed or removed: cached ``links_over`` results are stale then.
_generation = 0


class ModelLink:
    """Sync state shared by the wrappers of one user model."""

    def __init__(self):
        self._training = None  # weakref to the live training wrapper
        self.version = 0  # device weight version of the training wrapper
        self.host_dirty = False
        self._pulling = False

    @property
    def training(self):
        wrapper = self._training() if self._training is not None else None
        return wrapper

    def set_training(self, wrapper) -> None:
        self._training = weakref.ref(wrapper) if wrapper is not None else None

    def device_moved(self) -> None:
        """A training run changed the device weights."""
        self.version += 1
        self.host_dirty = True

    def pull(self) -> None:
        """Copy the training wrapper's device weights to the host if they are newer."""
        if not self.host_dirty or self._pulling:
            return
        wrapper = self.training
        if wrapper is None or not wrapper.isCompiled() or not wrapper.isAttachedToDevice():
            return
        self._pulling = True
        try:
            wrapper.copyWeightsToHost()
        finally:
            self._pulling = False


def link_of(model: torch.nn.Module) -> ModelLink:
    link = _LINKS.get(model)
    if link is None:
        link = _LINKS[model] = ModelLink()
    return link


def generation() -> int:
    return _generation


def links_over(model: torch.nn.Module) -> tuple[ModelLink, ...]:
    """The links of the training wrappers holding ``model`` or any of its submodules (its own
    model, a model containing it, or a submodule of it), each once."""
    found = {}
    for module in model.modules():
        link = _MODULE_LINKS.get(module)
        if link is not None:
            found[id(link)] = link
    return tuple(found.values())


def _pull(module) -> None:
    link = _MODULE_LINKS.get(module)
    if link is not None and link.host_dirty:
        link.pull()


def _hooked_class(cls: type) -> type:
    hooked = _HOOKED_CLASSES.get(cls)
    if hooked is not None:
        return hooked

    def __getattr__(self, name):  # noqa: N807 - only reached for params, buffers, submodules
        _pull(self)
        return cls.__getattr__(self, name)

    def named_parameters(self, *args, **kwargs):
        _pull(self)
        return cls.named_parameters(self, *args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        _pull(self)
        return cls.named_buffers(self, *args, **kwargs)

    def state_dict(self, *args, **kwargs):
        _pull(self)
        return cls.state_dict(self, *args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):
        _pull(self)
        return cls._load_from_state_dict(self, *args, **kwargs)

    def __reduce_ex__(self, protocol):
        # Pickle (torch.save) and deepcopy as the user's own class, with current weights.
        _pull(self)
        return _new_instance, (cls,), self.__getstate__()

    hooked = type(cls.__name__, (cls,), {
        "__getattr__": __getattr__, "named_parameters": named_parameters,
        "named_buffers": named_buffers, "state_dict": state_dict,
        "_load_from_state_dict": _load_from_state_dict,
        "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "_poptorch_lite_original": cls,
    })
    _HOOKED_CLASSES[cls] = hooked
    return hooked


def _new_instance(cls: type):
    return cls.__new__(cls)


def install_hooks(model: torch.nn.Module, link: ModelLink) -> None:
    """Swap every module of ``model`` to its pulling subclass."""
    global _generation
    _generation += 1
    for module in model.modules():
        _MODULE_LINKS[module] = link
        cls = type(module)
        if "_poptorch_lite_original" not in cls.__dict__:
            module.__class__ = _hooked_class(cls)


def remove_hooks(model: torch.nn.Module) -> None:
    """Restore the user's classes (``destroy()``)."""
    global _generation
    _generation += 1
    for module in model.modules():
        _MODULE_LINKS.pop(module, None)
        original = type(module).__dict__.get("_poptorch_lite_original")
        if original is not None:
            module.__class__ = original
