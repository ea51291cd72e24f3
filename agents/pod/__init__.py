"""The pod service: takes an initialization, trains a round, publishes the checkpoint."""
