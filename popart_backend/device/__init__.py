"""The simulated IPU: hardware facts, device objects, lowering, the execution plan."""
