"""Implementations under test: a registry, and one module per library."""
