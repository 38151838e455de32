"""The model: frozen backbones (rffm's and users'), the encoder that reads them, the classifier head, the exportable
classifier and its serialisers, the end-to-end reference CNN and metrics (their training: rffm.training)."""
