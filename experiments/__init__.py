"""The experiments behind the README's and the paper-reproduction's numbers: one script per job, run from the
checkout's root as ``python -m experiments.<script>`` (``python experiments/<script>.py`` works too, through the
editable install, which in a git worktree is the installed checkout's code), and :mod:`experiments.lib`, what the
scripts share (run records, the grid's definitions, reading runs back, figures, the published numbers, the
pretraining recipe). The statistics are esjax's own (:mod:`esjax.rundir.stats`); scripts use esjax's public API only.

The reports and files the scripts write name their command in the ``python experiments/<script>.py`` form, as the
committed ones always have (so that, regenerated, they stay byte for byte the same).
"""
