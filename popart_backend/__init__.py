"""PopART's Python API on a simulated IPU: ``import popart_backend as popart``."""

from .errors import *  # noqa: F401,F403
