"""The CPU backends that run a PIL program per sample: `threads` (with feedfast's C kernels) and `pil` (processes)."""
