"""Every op the backend knows. Importing this package registers them all."""

from . import registry  # noqa: F401
from . import elementwise  # noqa: F401
