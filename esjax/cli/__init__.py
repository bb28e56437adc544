"""The command-line entry points: ``python -m esjax.run`` (:mod:`.run`), ``python -m esjax.eval`` (:mod:`.eval`),
``python -m esjax.export`` (:mod:`.export`), ``python -m esjax.convert`` (:mod:`.convert`: a GGUF file as an HF folder)
and their shared plumbing (:mod:`.common`: user errors become one line).

The top layer: nothing else in esjax imports it (``python -m esjax.plan`` uses :mod:`.common` for its own entry).
"""
