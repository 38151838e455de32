"""How steps run: device and threads, the devices of a node shared by its jobs, adaptive batching, progress,
profiling, TensorBoard."""
