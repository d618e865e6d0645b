"""The overrides that shrink the GUI recipes to a few seconds of CPU training (tests only)."""

SHRUNK = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "sft.steps=3",
    "sft.num_demos=4",
    "sft.batch_size=2",
    "train.steps=2",
    "train.batch_size=2",
    "train.mini_batch_size=2",
    "rollout.group_size=2",
    "rollout.max_turns=3",
    "rollout.max_new_tokens=12",
    "eval.num_samples=2",
    "logging.console=false",
]
