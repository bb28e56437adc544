"""The command-line entry points: ``python -m esjax.run`` (:mod:`.run`), ``python -m esjax.eval`` (:mod:`.eval`),
``python -m esjax.export`` (:mod:`.export`) and their shared plumbing (:mod:`.common`: user errors become one line).

The top layer: nothing else in esjax imports it (``python -m esjax.plan`` uses :mod:`.common` for its own entry).
"""
