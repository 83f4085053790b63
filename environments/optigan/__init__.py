"""optiGAN: a conditional WGAN-GP of optical photons at a scintillation crystal's photodetector face.

Modules: mc.py (numpy optical MC, the stand-in data), data.py (HDF5 reference files + CLI), gate.py (GATE ROOT
phase-space reader), nets.py (opengate's networks + standardisation + gradient penalty), env.py (the Environment),
js.py (JS similarity and its MC-vs-MC ceiling), opengate.py (import/export of opengate's file), export.py (CLI).

`OptiGAN` and `OptiGANConfig` are imported lazily (PEP 562), so that the numpy-only parts (mc, js, data, gate)
do not pay for importing torch.
"""
__all__ = ["OptiGAN", "OptiGANConfig"]


def __getattr__(name):
    if name in __all__:
        from . import env

        return getattr(env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
