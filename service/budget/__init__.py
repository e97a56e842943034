"""Privacy budgets and plans: reservations and charges, the job planner's service side, a
job's privacy unit, budget freezes. Over ``governance``."""
