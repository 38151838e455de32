"""The pieces of a head epoch and the selection rule."""
