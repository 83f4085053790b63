"""SAGIPS: a Scalable Asynchronous Generative Inverse Problem Solver.

    mpiexec -n 4 python -m sagips.run --mode rma-arar-arar --config configs/proxy1d-quick.yaml

A GAN solves an inverse problem: the generator predicts physics parameters, a differentiable pipeline (an
environment) turns them into events, and every MPI rank's own discriminator compares those with reference data.
Only generator gradients cross ranks (`sagips.comm`).
"""
__version__ = "0.1.0"

__all__ = ["Environment", "ParametricEnvironment"]


def __getattr__(name: str):
    # lazy: `import sagips` must not import torch (sagips.run supervises its rank before torch and MPI load)
    if name == "ParametricEnvironment":
        from sagips.parametric import ParametricEnvironment

        return ParametricEnvironment
    if name == "Environment":
        from sagips.environment import Environment

        return Environment
    raise AttributeError(f"module 'sagips' has no attribute {name!r}")
