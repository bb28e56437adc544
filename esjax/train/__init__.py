"""Training: the ES loop (:mod:`.trainer`, dispatch → step → report → cohort → update → version), the parts it is
built from (:mod:`.parts`), its in-flight and evaluation bookkeeping (:mod:`.inflight`, :mod:`.evaluate`), the
live display (:mod:`.progress`) and a whole session around it: run directory, resume, processes (:mod:`.session`).

Layers: ``train`` uses ``config``, ``rundir`` and the core (``es``, ``model``, ``agent``, ``loop``, ``parallel``);
only ``cli`` sits above it.
"""
