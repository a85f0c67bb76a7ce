"""Where samples come from: shard lists, tar indexes, epoch assignment, synthetic shards."""
