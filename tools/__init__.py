"""Tools that run beside the gateway and are not part of it: the fault-injection upstream
(:mod:`tools.faults`, ``scripts/faulty-upstream``) and the serve loop it shares with the
tests' fake upstream. Not installed with the ``proxy`` and ``protocol`` packages; run from
the repository root."""
