"""What the user sees: all terminal drawing, on one shared console. Compute modules return
data and never print."""
