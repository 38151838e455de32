"""Everyday operations over a results tree: status, prune, unlock, posttrain, the config reference."""
