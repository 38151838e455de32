"""The model: frozen backbone, classifier head, pretraining objectives and metrics."""
