"""`mlxfit bench`: sweeps over training settings, and the search for the largest
batch size or sequence length that fits.

Pure logic over `plan.predict` and `parent.measure`: results come back as rows,
progress goes out through a callback, nothing is printed; mlxfit/render/bench.py
draws. One concern a module, each importing only those after it:

- `sweep.py`: the combinations of the swept settings, planned and run in order;
- `search.py`: `--max`, the largest batch size or sequence length that fits;
- `log.py`: the rows, their CSV log (a file of results, not terminal output) and
  what `--resume` reads back;
- `once.py`: one combination measured, whole or by slice.

This package re-exports their public names (`from mlxfit.measure.bench import Row`).

Which measured figure is judged against the budget: `peak_with_load_bytes`, MLX's
own peak including the model load. It is what mlx-lm's trainer reports and what
the estimate predicts, so a search on the estimate and its measured confirmation
speak about the same quantity. The process's resident peak is reported beside it.
"""

from .log import (  # noqa: F401
    COLUMNS, CONFIG_COLUMNS, ESTIMATED, EXIT_UNKNOWN, FAILED, FINAL, MEASURED, RESULT_COLUMNS,
    SKIPPED, UNKNOWN, CsvLog, Row, config_key,
)
from .once import (  # noqa: F401
    measure_once, speed,
)
from .search import (  # noqa: F401
    MAX_RUNS, SEARCH_LIMIT_UNITS, SEARCH_UNITS, MaxResult, SearchRun, find_max, largest,
)
from .sweep import (  # noqa: F401
    METHODS, SWEEPS, Planned, combinations, eta_seconds, measurement_row, parse_sweep, plan_sweep,
    reusable, run_sweep,
)
