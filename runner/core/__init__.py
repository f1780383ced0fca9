"""Shared by every part: the error types."""
