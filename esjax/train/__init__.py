"""Training: the ES loop (:mod:`.trainer`, dispatch → step → report → cohort → update → version), the parts it is
built from (:mod:`.parts`), its in-flight bookkeeping (:mod:`.inflight`), its evaluations as rows of the training
ticks (:mod:`.interleaved_eval`), the live display (:mod:`.progress`) and a whole session around it: run directory,
resume, processes (:mod:`.session`). :mod:`.standalone_eval` evaluates a policy on its own, outside a training run.

Layers: ``train`` uses ``config``, ``rundir`` and the core (``es``, ``model``, ``agent``, ``loop``, ``parallel``);
only ``cli`` sits above it.
"""
