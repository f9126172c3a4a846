"""Tier runtime: loader hooks and placement policies (streaming pools join with the tier-runtime issue)."""
