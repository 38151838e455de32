"""Inspecting and serving a results tree: status, verify, compare, prune, clean, unlock, predict, MLflow tracking, the
config reference."""
