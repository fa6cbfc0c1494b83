"""The two tasks (translation, super-resolution) and what their modules share."""

STAGE_SPLITS = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"]}  # the splits a Lightning stage reads
