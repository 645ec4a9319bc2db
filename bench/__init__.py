"""Benchmarks run by `make bench`; each module with a main() is one benchmark."""
