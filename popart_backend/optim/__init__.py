"""The user-facing optimizers: shared values and modes (``values.py``), the ``Optimizer`` base
(``base.py``) and the SGD, Adam and Adaptive families. ``Optimizer.apply`` adds the update ops
of ``ops/optimizer_updates.py`` to the IR."""
