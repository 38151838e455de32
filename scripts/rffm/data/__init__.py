"""Data: sources (synthetic, RadioML, SigMF, HDF5), staging, the split format and the hidden-state cache format."""
