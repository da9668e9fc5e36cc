"""Engine: hooks."""
from . import hooks  # noqa: F401
from . import dino_optim  # noqa: F401,E402
