"""What the experiment scripts share; a script imports from here and from esjax's public API, never another script.

- :mod:`.records`: a finished run directory reduced to the records worth committing;
- :mod:`.grid`: the staleness grid's cells, presets and run layout, and running one (cell, seed);
- :mod:`.runs`: reading finished runs and a grid's runs back, and comparing each cell with sync (paired by seed);
- :mod:`.study`: the pre-registered staleness study's fixed settings and its power rule (experiments/protocol.md);
- :mod:`.figures`: the figures drawn from a grid's runs;
- :mod:`.tables`: number formats of the markdown reports, and the published numbers;
- :mod:`.pretrain`: what the policy-pretraining scripts share.

Statistics are not here: they are :mod:`esjax.rundir.stats`, the one home that esjax's own run summaries use too.
"""

from pathlib import Path

#: The checkout's root, and where results are committed.
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
