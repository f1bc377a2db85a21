"""Training beside serving: the judge adapter and the scorer, their data and their training."""
