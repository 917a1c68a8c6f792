// Loaded with `node --import` into a child CLI by test/cli_ledger.test.mjs: moves Date.now (the
// wall clock) by $WALL_CLOCK_SHIFT_MS, leaving the monotonic clocks alone, as time-machine does for
// edge-agent in tests/edge_agent/test_budget_attacks.py.
const shift = Number(process.env.WALL_CLOCK_SHIFT_MS ?? 0);
const realNow = Date.now;
Date.now = () => realNow() + shift;
