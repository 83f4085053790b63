"""Ensemble post-analysis (paper section VI): `stats` (eqs. 6-9, pure numpy), `ensemble` (runs, checkpoints,
predictions), `figures` (matplotlib, Agg). The command line is `python -m sagips.analyze`."""
