"""Reusable test and demo harnesses (need nova's functional test tree)."""
