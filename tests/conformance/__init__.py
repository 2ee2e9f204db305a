"""CPython's regression suite, plain and vaccinated, compared test by test
(``make conformance``; see docs/conformance.md)."""
