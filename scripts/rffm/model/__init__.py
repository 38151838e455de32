"""The model: frozen backbone, classifier head, pretraining objectives, the end-to-end reference CNN and metrics."""
