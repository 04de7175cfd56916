"""vLLM environments: the test environment and its proof, the shadow package laid over it, the
wheel's RECORD and the check of installed files against it."""
