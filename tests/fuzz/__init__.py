"""Differential fuzzing: generated programs, run plain and vaccinated, compared.

``program`` makes the programs (pysource-codegen's random programs, made to
run: see its docstring), ``compare`` runs one plain (twice) and vaccinated in
one forked child of the calling process, ``run`` is the long run and the
shrinker (``python -m tests.fuzz.run --help``; ``make fuzz N=20000``).
tests/test_fuzz.py runs a fixed slice and every kept program
(``kept_programs.txt``).
"""
