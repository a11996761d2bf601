"""`mlxfit bench`: sweeps over training settings, and the search for the largest
batch size or sequence length that fits (being split into one module per concern)."""

from .once import (  # noqa: F401
    measure_once, speed,
)
from .sweep import (  # noqa: F401
    COLUMNS, CONFIG_COLUMNS, ESTIMATED, EXIT_UNKNOWN, FAILED, FINAL, MAX_RUNS, MEASURED, METHODS,
    RESULT_COLUMNS, SEARCH_LIMIT_UNITS, SEARCH_UNITS, SKIPPED, SWEEPS, UNKNOWN, CsvLog, MaxResult,
    Planned, Row, SearchRun, combinations, config_key, eta_seconds, find_max, largest,
    measurement_row, parse_sweep, plan_sweep, reusable, run_sweep,
)
