"""The execbox runner benchmark as a package; ``benchmarks/bench.py`` and ``benchmarks/cancel.py`` are its commands.

One concept a module, so a figure can be traced to the code that measures it
without reading the whole benchmark (``benchmarks/README.md`` has the map).
"""
