"""What the user sees: all terminal drawing and JSON printing, on one shared console.
Compute modules return data and never print."""
