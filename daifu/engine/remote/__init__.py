"""The engine's reach outside the process: the run directory and its
control socket (``_rundir``, ``_control``), the sealed values ranks exchange
(``_seal``), the job's store across ranks (``_jobstore``), the decisions all
ranks take together (``_distributed``) and the hung-job doctor (``_doctor``).
Modules are imported where they are used."""
