"""memoryd benchmarks: ``python -m bench`` (see bench/__main__.py) and ``python -m bench.soak``."""
