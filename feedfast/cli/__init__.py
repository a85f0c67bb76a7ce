"""The command line: ``feedfast bench | analyze | plan | shards | doctor``."""
