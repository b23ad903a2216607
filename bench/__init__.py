"""Benchmarks: each ``bench/<name>.py`` has ``main()`` and writes ``bench/results/<name>.json``."""
