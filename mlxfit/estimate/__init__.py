"""What the run will need: the rule of thumb, the detailed estimate and its range, the plan
against the budget with what to change, and the measurements that calibrate it."""
