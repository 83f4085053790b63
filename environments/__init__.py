"""SAGIPS environments, installed as the import package `sagips_environments` (see pyproject.toml).

Each environment registers through the entry-point group `sagips.environments`, as a third-party package would.
Environments are pure: they never import mpi4py.
"""
