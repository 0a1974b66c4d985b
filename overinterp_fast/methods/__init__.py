"""The algorithms: exact and batched-gradient SIS, causal responsibility, and sets extracted from rankings."""
