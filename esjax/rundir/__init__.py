"""What a run leaves on disk and how it is read back: the run directory (:mod:`.directory`), checkpoints
(:mod:`.checkpoint`), metrics records and their written schema (:mod:`.metrics`, :mod:`.metrics_schema`), episode
traces (:mod:`.traces`), plots (:mod:`.plots`), the statistics of runs (:mod:`.stats`: the intervals a run reports,
and the paired comparisons over seeds that experiments/ makes) and the machine a run ran on (:mod:`.machine`).

Layers: ``rundir`` uses ``config`` and the core; ``train`` and ``cli`` use it, never the other way round.
"""
