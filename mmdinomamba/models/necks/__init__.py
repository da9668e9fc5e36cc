"""models/necks."""
from .probe_neck import POOLINGS, ProbeFeatureNeck, pool_tokens  # noqa: F401
