"""``python -m tidal.data.clean --config C --input NAME=DIR --out DIR``: the job face of the kind."""

from tidal.data.clean import step
from tidal.data.jobcli import main

main(step, "clean")
