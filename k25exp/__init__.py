"""k25exp: declarative experiments for MoE serving performance."""

__version__ = "0.1.0"
