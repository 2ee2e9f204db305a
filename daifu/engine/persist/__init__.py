"""The engine's memory: the journal of crashes and fixes (``_journal``), the
emergency checkpoint (``_checkpoint``), the save at SIGTERM (``_preempt``)
and the resume point that makes a resumed run exact (``_resume``).  Modules
are imported where they are used."""
