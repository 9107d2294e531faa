"""``poptorch_lite.Options`` (``options.py``), its enums, option groups (``groups.py``) and
text forms (``files.py``)."""
