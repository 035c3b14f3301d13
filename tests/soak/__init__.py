"""Chaos soak: random fault-injecting programs checked against a sequential model."""
