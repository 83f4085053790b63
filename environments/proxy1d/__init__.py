"""Proxy 1D app: 6 parameters -> two observables (the SAGIPS paper's loop-closure test)."""
from .env import Proxy1D, Proxy1DConfig

__all__ = ["Proxy1D", "Proxy1DConfig"]
