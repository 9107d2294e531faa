"""Every op the backend knows. Importing this package registers them all."""

from . import registry  # noqa: F401
from . import elementwise  # noqa: F401
from . import unary  # noqa: F401
from . import activations  # noqa: F401
from . import logic  # noqa: F401
from . import cast  # noqa: F401
from . import loss  # noqa: F401
from . import gather_scatter  # noqa: F401
from . import shape  # noqa: F401
from . import reduce  # noqa: F401
from . import matmul  # noqa: F401
from . import conv  # noqa: F401
from . import pool  # noqa: F401
from . import norm  # noqa: F401
from . import softmax  # noqa: F401
from . import random  # noqa: F401
from . import resize  # noqa: F401
from . import accumulate  # noqa: F401
from . import optimizer_updates  # noqa: F401
