"""Data: sources (synthetic, RadioML, SigMF, HDF5), staging, the split format, and the hidden-state cache: its format,
its writer (one process or one worker per device), its checked reader, its node-local lifecycle and its planner."""
