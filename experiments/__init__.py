"""The experiments behind the README's and the paper-reproduction's numbers: one script per job, run from the
checkout's root as ``python -m experiments.<script>`` (``python experiments/<script>.py`` works too, through the
editable install), and :mod:`experiments.lib`, what the scripts share (run records, grid definitions, reading runs,
figures, tables). The statistics are esjax's own (:mod:`esjax.rundir.stats`); scripts use esjax's public API only.
"""
