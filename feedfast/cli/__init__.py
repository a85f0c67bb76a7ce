"""The command line: ``feedfast bench | plan | shards``."""
