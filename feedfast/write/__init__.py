"""Writing shards: image folders and lists to tars, synthetic shards, the demo set."""
