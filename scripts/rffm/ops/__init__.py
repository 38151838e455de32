"""Everyday operations over a results tree: status, compare, prune, unlock, posttrain, the config reference."""
