"""The folder ``feedfast watch`` puts first on a job's ``PYTHONPATH``: it holds only ``sitecustomize.py``.

Python's ``site`` module imports ``sitecustomize`` at every interpreter start, so each Python
process of the job (torchrun's ranks, Lightning's DDP children, spawned DataLoader workers)
loads :mod:`feedfast.meter.startup.sitecustomize` before its own code runs. This package file
exists so the folder installs with feedfast; nothing imports it.
"""
