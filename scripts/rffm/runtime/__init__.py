"""How steps run: device and threads, adaptive batching, progress, profiling, TensorBoard."""
