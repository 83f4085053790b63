"""Files and data movement: atomic checkpoints, JSON Lines metrics, HDF5 reference data, broadcast + bootstrap."""
