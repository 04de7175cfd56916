"""The CPU line: the series carried onto the CPU runtime's release (carry, recarry) and that runtime (runtime)."""
