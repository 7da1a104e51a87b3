"""The all-in-one demo: a GPU cloud in one process, servers booted on it."""
