"""Sample orders as pure functions of (seed, epoch): the permutation, the deal to ranks, repeats, per-sample draws."""
