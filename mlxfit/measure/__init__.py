"""What the run really takes: a few real mlx-lm training steps in a child process (the whole
model, or slices of it), and bench's sweeps and searches over settings."""
