"""Sampling: a request's parameters, the numpy sampler, and the grammar constraints that mask it."""
