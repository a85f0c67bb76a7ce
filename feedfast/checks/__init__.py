"""Image and label checks, the worker processes that run them, and the decoders they ask."""
