"""Tar shards: reading them (`tar/`), their indexes (`index/`) and the transports that bring their bytes (`transport/`)."""
