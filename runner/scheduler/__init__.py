"""The step loop: requests, slots, one batch plan per step, verification and detokenizing.

Nothing here imports the model runtime: it is tested on a scripted fake."""
