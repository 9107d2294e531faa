"""Session options: ``SessionOptions`` (``session_options.py``), its enums and structs, the
type-checked assignment they share (``typed.py``), ``Patterns`` and the checks of which options
the session implements (``checks.py``)."""
