"""Reading tar shards as `tarfile` reads them, without `tarfile`: headers, members, samples, and damage."""
