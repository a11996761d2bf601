"""What is to be trained: the model resolved and sized from mlx-lm's own classes, the
training settings (flags and mlx-lm's YAML) and the user's data in tokens."""
