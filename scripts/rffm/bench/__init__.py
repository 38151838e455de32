"""Benchmarks (`rffm bench cache|sweep|staging`): measured side by side, never imported by a step."""
