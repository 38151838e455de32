"""Benchmarks (`rffm bench cache|sweep|grid|staging`): measured side by side, never imported by a step."""
