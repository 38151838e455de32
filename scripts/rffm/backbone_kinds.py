"""Backbone kinds: a backbone's config `source` (its enum in config.schema.yaml) and the groups the code branches on,
in one torch-free place that every module treating kinds differently imports."""

PRETRAIN, RANDOM, CHECKPOINT, PYTHON, EXPORT = "pretrain", "random", "checkpoint", "python", "export"
KINDS = (PRETRAIN, RANDOM, CHECKPOINT, PYTHON, EXPORT)
BUILT_HERE = (PRETRAIN, RANDOM)  # pretrain_backbone writes their backbone.pt from `arch`
IMPORTED = (CHECKPOINT, PYTHON, EXPORT)  # import_backbone fingerprints a user's file (`path`, `sha256`)
NATIVE = (*BUILT_HERE, CHECKPOINT)  # their file is an rffm backbone.pt (IQPatchTransformer)
USER_CODE = (PYTHON, EXPORT)  # the user's model class, or a torch.export program
