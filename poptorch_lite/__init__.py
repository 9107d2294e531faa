"""PopTorch's API over popart_backend (issue #4 builds it): ``import poptorch_lite as poptorch``."""
