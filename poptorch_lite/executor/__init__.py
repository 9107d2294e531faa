"""The wrapper a user calls (``PoplarExecutor`` in ``executor.py``) and its parts: compiling a
module into a backend session (``compilation.py``), running it (``running.py``), moving weights
and optimizer state (``state_sync.py``, ``weight_sync.py``) and multi-process set-up
(``distributed.py``)."""
