"""rffm: post-train RF signal classifiers on frozen RF foundation-model backbones."""

__version__ = "0.1.0"
