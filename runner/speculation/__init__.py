"""Speculative decoding: drafters, the auto policy and the cost model it prices steps with."""
