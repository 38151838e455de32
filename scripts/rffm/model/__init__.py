"""The model: frozen backbone, classifier head, the end-to-end reference CNN and metrics (their training: rffm.training)."""
