"""`mlxfit bench`: sweeps over training settings, and the search for the largest
batch size or sequence length that fits (being split into one module per concern)."""

from .log import (  # noqa: F401
    COLUMNS, CONFIG_COLUMNS, ESTIMATED, EXIT_UNKNOWN, FAILED, FINAL, MEASURED, RESULT_COLUMNS,
    SKIPPED, UNKNOWN, CsvLog, Row, config_key,
)
from .once import (  # noqa: F401
    measure_once, speed,
)
from .sweep import (  # noqa: F401
    MAX_RUNS, METHODS, SEARCH_LIMIT_UNITS, SEARCH_UNITS, SWEEPS, MaxResult, Planned, SearchRun,
    combinations, eta_seconds, find_max, largest, measurement_row, parse_sweep, plan_sweep,
    reusable, run_sweep,
)
