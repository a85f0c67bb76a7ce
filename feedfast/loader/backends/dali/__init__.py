"""The DALI backend: the pipeline, its feed, checkpoints, and the recovery and diagnosis of failed batches."""
