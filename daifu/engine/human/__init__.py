"""The engine's human interface: what a person at the job sees and types.

The console (``_console``), the crash report (``_report``), the wait for a
person at a crash (``_waiter``), ``break`` points set from the console
(``_break``) and the progress displays that step aside for it
(``_progress``).  The engine core decides; this wing asks and shows.  Its
modules are imported where they are used (start-up: nothing here loads
before the first crash)."""
