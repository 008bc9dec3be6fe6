"""Collectives and parallel topology on the target."""
